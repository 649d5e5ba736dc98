"""mccl.ray on a real local Ray cluster: TorchTrainer over mccl, Lightning inside Ray, F04/F05, bad input.

The module's cluster is two Ray nodes on loopback, each started with the project's own
``mccl-ray-node`` command (``ray start --block`` underneath), each holding one unit of ``pool:mac``
and one CPU. The head also advertises ``GPU: 1`` like a Mac under a Ray that detects Apple GPUs;
the other node advertises none, like a Mac under an older Ray (field case F04). Every node process
is stopped by its process id when the module ends, whatever happened.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import ray
import ray.train
import torch

import mccl.ray as mr
from raynodes import forget_cluster, stop_nodes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HAS_MPS = torch.backends.mps.is_available()
STEPS = 10
#: The environment of every job this module submits: a GPU cluster's NCCL settings and a marker.
JOB_ENV = {"NCCL_SOCKET_IFNAME": "eth9", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "MCCL_TEST_MARKER": "1"}
NODE_ARGS = ["--num-cpus=1", "--object-store-memory=100000000", "--disable-usage-stats", "--node-ip-address=127.0.0.1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_node(args: list[str], log_path: str) -> subprocess.Popen:
    # Workers unpickle this module's training functions by reference: the "machines" have it installed.
    here = os.path.dirname(os.path.abspath(__file__))
    # The nodes are stopped (SIGTERM) only when the module's tests are done: no drain (Ray waits up to
    # 30 s for the node's leftover workers to go, which was half a minute of every CI run).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p),
               RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-m", "mccl.ray.node", "--block", *args], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _alive_nodes() -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Address of a 2-node Ray cluster on loopback (head: GPU 1, worker: GPU 0 and --ifname lo)."""
    logs = tmp_path_factory.mktemp("ray-nodes")
    # A loopback-only cluster: no token authentication, for the nodes, this driver and the example's
    # driver alike (Ray would otherwise turn it on from whatever ~/.ray/auth_token holds).
    saved_auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    port = free_port()
    address = f"127.0.0.1:{port}"
    procs = []
    worker_tmp = None
    try:
        procs.append(_start_node(["--head", f"--port={port}", "--", *NODE_ARGS, "--num-gpus=1",
                                  "--include-dashboard=false"],
                                 str(logs / "head.log")))
        deadline = time.monotonic() + 120
        while "Ray runtime started" not in (logs / "head.log").read_text():
            assert procs[0].poll() is None, "the head node exited:\n" + (logs / "head.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no head node within 120 s:\n" + (logs / "head.log").read_text()[-3000:]
            time.sleep(1)
        ray.init(address=address, logging_level="WARNING", runtime_env={"env_vars": JOB_ENV})
        # The worker node keeps its session (logs included) apart from the head's, as a second
        # machine would: two nodes' log monitors reading one logs folder send every worker line to
        # the driver twice. A short path: Ray's socket paths must fit in 107 bytes.
        worker_tmp = tempfile.mkdtemp(prefix="mccl-rw-")
        procs.append(_start_node(["--address", address, "--ifname", "lo", "--", *NODE_ARGS, "--num-gpus=0",
                                  f"--temp-dir={worker_tmp}"],
                                 str(logs / "worker.log")))
        while time.monotonic() < deadline and len(_alive_nodes()) < 2:
            assert procs[1].poll() is None, (logs / "worker.log").read_text()[-3000:]
            time.sleep(1)
        assert len(_alive_nodes()) == 2, "the worker node did not join:\n" + (logs / "worker.log").read_text()[-3000:]
        yield address
    finally:
        if ray.is_initialized():
            ray.shutdown()
        stop_nodes(list(reversed(procs)))
        forget_cluster(port)
        if worker_tmp:
            shutil.rmtree(worker_tmp, ignore_errors=True)
        if saved_auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved_auth


def _record(config: dict, name: str, payload: dict) -> None:
    """Workers write what they saw to files (all nodes share this host's filesystem)."""
    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["out"], f"{name}-{rank}.json"), "w") as f:
        json.dump(payload, f)


def _records(out: str, name: str) -> list[dict]:
    records = []
    for path in sorted(glob.glob(os.path.join(out, f"{name}-*.json"))):
        with open(path) as f:
            records.append(json.load(f))
    return records


def _report_with_checkpoint(metrics: dict) -> None:
    """Ray Train v2 keeps the metrics of reports that carry a checkpoint; rank 0 attaches one."""
    import tempfile

    import ray.train

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = None
        if ray.train.get_context().get_world_rank() == 0:
            torch.save(metrics, os.path.join(tmp, "metrics.pt"))
            ckpt = ray.train.Checkpoint.from_directory(tmp)
        ray.train.report(metrics, checkpoint=ckpt)


def _data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 4, generator=gen), torch.randn(8, 1, generator=gen)


def _ddp_loop(config: dict) -> None:
    import hashlib

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    device = mr.get_device()
    env = {k: os.environ.get(k) for k in ("MCCL_SOCKET_IFNAME", "MCCL_TEST_MARKER")}
    nccl = sorted(k for k in os.environ if k.startswith(("NCCL_", "TORCH_NCCL_")))
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = (t.to(device) for t in _data(rank))
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    params = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
    _record(config, "ddp", {
        "backend": dist.get_backend(), "device": str(device), "mps": torch.backends.mps.is_available(),
        "node": ray.get_runtime_context().get_node_id(), "env": env, "nccl": nccl,
        "digest": hashlib.sha256(params.numpy().tobytes()).hexdigest(), "params": params.tolist()})
    _report_with_checkpoint({"loss": loss.item()})


def _expected_ddp_run() -> tuple[float, torch.Tensor]:
    """The same 10 steps in one process: gradients averaged over the two ranks' data."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [_data(r) for r in range(2)]
    for _ in range(STEPS):
        grads = []
        for x, y in data:
            model.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            if len(grads) == 1:
                loss0 = loss.item()
        for p, g0, g1 in zip(model.parameters(), *grads):
            p.grad = (g0 + g1) / 2
        opt.step()
    return loss0, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


@pytest.mark.timeout(240)
def test_torchtrainer_over_mccl_two_machines(cluster, tmp_path, monkeypatch):
    """2-worker TorchTrainer, backend mccl, 10 steps; F04: one node with GPU:1, one with none."""
    monkeypatch.setenv("NCCL_RAS_ADDR", "127.0.0.1:28028")  # Ray propagates this one to every worker
    trainer = mr.MCCLTrainer(
        _ddp_loop, train_loop_config={"out": str(tmp_path)}, scaling_config=mr.scaling_config(2),
        run_config=ray.train.RunConfig(storage_path=str(tmp_path / "results")),
        placement_timeout_s=60)  # F04: both workers running within 60 s, or a clear error
    result = trainer.fit()
    recs = _records(str(tmp_path), "ddp")
    assert len(recs) == 2
    assert [r["backend"] for r in recs] == ["mccl", "mccl"]
    assert recs[0]["node"] != recs[1]["node"], "both workers landed on one machine"
    assert all(r["device"] == str(mr.get_device()) for r in recs)
    # The job's runtime env (see the fixture) reached the workers, its NCCL variables did not.
    assert all(r["env"]["MCCL_TEST_MARKER"] == "1" and r["nccl"] == [] for r in recs), recs
    # The node started with `mccl-ray-node --ifname lo` hands MCCL_SOCKET_IFNAME to its worker.
    assert sorted(str(r["env"]["MCCL_SOCKET_IFNAME"]) for r in recs) == ["None", "lo"]
    assert recs[0]["digest"] == recs[1]["digest"], "the workers' weights differ bitwise"
    want_loss, want_params = _expected_ddp_run()
    assert result.metrics["loss"] == pytest.approx(want_loss, rel=1e-6)
    assert torch.allclose(torch.tensor(recs[0]["params"]), want_params, rtol=1e-6, atol=1e-7)


@pytest.mark.timeout(60)
def test_more_workers_than_machines_fails_before_scheduling(cluster):
    start = time.monotonic()
    with pytest.raises(mr.InsufficientMachinesError) as err:
        mr.MCCLTrainer(lambda: None, scaling_config=mr.scaling_config(3)).fit()
    msg = str(err.value)
    assert "3 worker(s) need" in msg and "can hold 2" in msg and "'pool:mac'" in msg and "mccl-ray-node" in msg
    assert time.monotonic() - start < 30


@pytest.mark.timeout(60)
def test_f04_whole_gpu_per_worker_on_one_gpu_macs_is_a_clear_error(cluster):
    """Two workers asking for Ray's GPU where only one Mac counts one: a scheduling error, not PENDING."""
    with pytest.raises(mr.InsufficientMachinesError, match=r"can hold 1.*'GPU'.*use_gpu=False is enough"):
        mr.MCCLTrainer(lambda: None, scaling_config=mr.scaling_config(2, use_gpu=True)).fit()
    # More than one MPS device per host, asked of Ray: no machine has two GPUs.
    with pytest.raises(mr.InsufficientMachinesError, match=r"can hold 0"):
        mr.MCCLTrainer(lambda: None, scaling_config=mr.scaling_config(1, use_gpu=True, extra_resources={"GPU": 2})).fit()


@pytest.mark.timeout(120)
def test_resources_held_elsewhere_fail_after_the_placement_timeout(cluster, tmp_path):
    @ray.remote(num_cpus=0, resources={"pool:mac": 1})
    class Holder:
        def ping(self) -> int:
            return 1

    holder = Holder.remote()
    try:
        assert ray.get(holder.ping.remote(), timeout=60) == 1
        start = time.monotonic()
        with pytest.raises(mr.PlacementTimeoutError, match=r"not placed within 5 s.*held by other jobs"):
            mr.MCCLTrainer(lambda: None, scaling_config=mr.scaling_config(2), placement_timeout_s=5,
                           run_config=ray.train.RunConfig(storage_path=str(tmp_path))).fit()
        assert time.monotonic() - start < 90
    finally:
        ray.kill(holder)


def _lightning_loop(config: dict) -> None:
    """F05: Lightning's BoringModel inside Ray Train, through prepare_trainer, on the machine's device."""
    import hashlib

    import lightning as L
    import torch.distributed as dist
    from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer
    from torch.utils.data import DataLoader, TensorDataset

    import mccl.lightning  # noqa: F401  (accelerator "mccl")
    from mccl.ray.lightning import RayMCCLStrategy

    class BoringModel(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(32, 2)

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).sum()
            self.log("loss", loss, sync_dist=True)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    model = BoringModel()
    data = TensorDataset(torch.randn(64, 32, generator=torch.Generator().manual_seed(3)))
    trainer = L.Trainer(accelerator="mccl", devices=1, strategy=RayMCCLStrategy(), max_steps=STEPS,
                        plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer = prepare_trainer(trainer)  # raises for any strategy that is not a Ray one
    trainer.fit(model, DataLoader(data, batch_size=2))
    state = torch.cat([v.detach().cpu().reshape(-1) for v in model.state_dict().values()])
    _record(config, "lightning", {
        "backend": dist.get_backend(), "root": str(trainer.strategy.root_device),
        "is_ray_strategy": isinstance(trainer.strategy, RayDDPStrategy), "steps": trainer.global_step,
        "mps": torch.backends.mps.is_available(), "world": trainer.world_size,
        "digest": hashlib.sha256(state.numpy().tobytes()).hexdigest()})


def _run_lightning_in_ray(tmp_path) -> tuple[dict, list[dict]]:
    trainer = mr.MCCLTrainer(_lightning_loop, train_loop_config={"out": str(tmp_path)},
                             scaling_config=mr.scaling_config(2),
                             run_config=ray.train.RunConfig(storage_path=str(tmp_path / "results")))
    result = trainer.fit()
    return result.metrics, _records(str(tmp_path), "lightning")


@pytest.mark.timeout(240)
def test_f05_lightning_inside_ray_train(cluster, tmp_path):
    metrics, recs = _run_lightning_in_ray(tmp_path)
    assert len(recs) == 2
    for r in recs:
        assert r["backend"] == "mccl" and r["is_ray_strategy"] and r["world"] == 2 and r["steps"] == STEPS
        assert r["root"] == str(mr.get_device()), "the worker did not train on its machine's device"
    assert recs[0]["digest"] == recs[1]["digest"], "final state_dicts differ between the workers"
    assert metrics["step"] == STEPS and isinstance(metrics["loss"], float)


@pytest.mark.skipif(not HAS_MPS, reason="needs an MPS device (Apple silicon)")
@pytest.mark.timeout(240)
def test_f05_lightning_inside_ray_train_on_mps(cluster, tmp_path):
    metrics, recs = _run_lightning_in_ray(tmp_path)
    assert [r["root"] for r in recs] == ["mps:0", "mps:0"]
    assert recs[0]["digest"] == recs[1]["digest"] and metrics["step"] == STEPS


@pytest.mark.skipif(not HAS_MPS, reason="needs an MPS device (Apple silicon)")
@pytest.mark.timeout(240)
def test_f04_workers_see_and_train_on_mps(cluster, tmp_path):
    result = mr.MCCLTrainer(_ddp_loop, train_loop_config={"out": str(tmp_path)}, scaling_config=mr.scaling_config(2),
                            run_config=ray.train.RunConfig(storage_path=str(tmp_path / "results")),
                            placement_timeout_s=60).fit()
    recs = _records(str(tmp_path), "ddp")
    assert [(r["mps"], r["device"]) for r in recs] == [(True, "mps:0")] * 2
    assert recs[0]["digest"] == recs[1]["digest"] and "loss" in result.metrics


def _accuracy(output: str) -> str:
    return output.split("final validation accuracy ")[1].split("%")[0]


def _epoch_rows(output: str) -> list[int]:
    """The epoch numbers of the examples' per-epoch rows (train.py's table; Ray's worker prefix allowed)."""
    row = re.compile(r"(\d+)\s+(?:\d+\.\d{4}|nan)\s+(?:\d+\.\d{4}|nan)\s+(?:\d+\.\d{2}|nan)%\s+(?:\d+|nan)\s*$")
    return [int(m.group(1)) for m in map(row.search, output.splitlines()) if m]


def _repeated_lines(output: str) -> list[str]:
    """Non-blank lines that occur more than once, and Ray's note that it folded repeats."""
    lines = [line for line in output.splitlines() if line.strip()]
    return sorted({line for line in lines if lines.count(line) > 1} | {line for line in lines if "[repeated " in line})


@pytest.mark.timeout(300)
def test_ray_example_trains_like_the_lightning_example(cluster, tmp_path):
    """examples/ray_train.py against this cluster, 10 steps; the same module under Lightning alone
    (examples/lightning_train.py, 2 ranks) reaches the same validation accuracy. Neither prints a
    line twice nor Ray's State API warning, both print the per-epoch line with no terminal, and the
    Ray example's temporary results folder is gone when it exits."""
    common = ["--epochs", "1", "--limit-train-batches", str(STEPS), "--target-acc", "0"]
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.run([sys.executable, "examples/ray_train.py", "--address", cluster, *common],
                          cwd=ROOT, capture_output=True, text=True, timeout=240, env=dict(os.environ, TMPDIR=str(tmp)))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "backend=mccl strategy=RayMCCLStrategy" in out and f"world_size=2 steps={STEPS}" in out
    assert "parameters bitwise equal on all 2 workers" in out
    assert "final metrics: train_loss_epoch=" in out and f"step={STEPS}" in out
    assert "epoch train_loss  val_loss  val_acc  samples/s" in proc.stdout
    assert _epoch_rows(proc.stdout) == [1], proc.stdout
    assert "Failed to query Ray Train Controller actor state" not in out, out[-4000:]
    assert _repeated_lines(out) == [], out[-4000:]
    assert [p.name for p in tmp.iterdir() if p.name.startswith("mccl-ray-")] == [], "temporary results left behind"
    alone = subprocess.run([sys.executable, "examples/lightning_train.py", "--devices", "2", *common],
                           cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert alone.returncode == 0, (alone.stdout + alone.stderr)[-4000:]
    assert "parameters bitwise equal on all 2 ranks" in alone.stdout
    assert _accuracy(out) == _accuracy(alone.stdout)
    assert _epoch_rows(alone.stdout) == [1], alone.stdout
    assert _repeated_lines(alone.stdout + alone.stderr) == [], alone.stdout + alone.stderr


def test_mccl_config_and_trainer_reject_other_backends():
    from ray.train.torch import TorchConfig

    assert mr.MCCLConfig().backend == "mccl" and mr.MCCLConfig(backend=None).backend == "mccl"
    with pytest.raises(ValueError, match="runs the 'mccl' backend"):
        mr.MCCLConfig(backend="gloo")
    with pytest.raises(ValueError, match="runs the 'mccl' backend"):
        mr.MCCLTrainer(lambda: None, scaling_config=mr.scaling_config(2), torch_config=TorchConfig(backend="nccl"))


def test_scaling_configs_are_one_unit_per_machine():
    from ray.train import ScalingConfig

    sc = mr.scaling_config(4)
    assert mr.resources_per_worker(sc) == {"CPU": 1.0, "pool:mac": 1.0}
    assert sc.placement_strategy == "SPREAD" and not sc.use_gpu
    # A GPU cluster's ScalingConfig gets the resource and SPREAD added, keeps its GPU request.
    trainer = mr.MCCLTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=4, use_gpu=True))
    assert mr.resources_per_worker(trainer.scaling_config) == {"GPU": 1.0, "pool:mac": 1.0}
    assert trainer.scaling_config.placement_strategy == "SPREAD"
    assert trainer.run_config.failure_config.controller_failure_limit == 0  # no endless rescheduling
    # Elastic (issue 19): a (min, max) range, one unit per machine all the same.
    el = mr.scaling_config((2, 5), resize_interval_s=15)
    assert (el.min_workers, el.max_workers, el.elastic_resize_monitor_interval_s) == (2, 5, 15.0)
    assert mr.resources_per_worker(el) == {"CPU": 1.0, "pool:mac": 1.0} and el.elasticity_enabled
    trainer = mr.MCCLTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=(1, 4)))
    assert trainer.scaling_config.num_workers == (1, 4)
    assert mr.resources_per_worker(trainer.scaling_config) == {"CPU": 1.0, "pool:mac": 1.0}
    # A restart after a loss may ask once for the machine that left: retries, a shorter timeout,
    # and the controller callback that refreshes Ray's picture of the machines when workers fail.
    assert trainer.run_config.failure_config.controller_failure_limit == mr.DEFAULT_ELASTIC_PLACEMENT_RETRIES == 10
    assert trainer._placement_timeout_s == mr.DEFAULT_ELASTIC_PLACEMENT_TIMEOUT_S == 30.0
    assert [type(c).__name__ for c in trainer.run_config.callbacks] == ["_RefreshOnWorkerLoss"]
    assert mr.MCCLTrainer(lambda: None, scaling_config=el, resource_refresh_s=None).run_config.callbacks == []
    fixed = mr.MCCLTrainer(lambda: None, scaling_config=mr.scaling_config(2))
    assert fixed.run_config.callbacks == [] and fixed._placement_timeout_s == 60.0
    for bad in (lambda: mr.scaling_config(0), lambda: mr.scaling_config(2, placement_strategy="PACK"),
                lambda: mr.scaling_config((3, 2)), lambda: mr.scaling_config((0, 2)),
                lambda: mr.scaling_config((1, 2, 3)),
                lambda: mr.MCCLTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=(0, 4))),
                lambda: mr.MCCLTrainer(lambda: None, scaling_config=ScalingConfig(
                    num_workers=2, resources_per_worker={"CPU": 1, "pool:mac": 0.5}))):
        with pytest.raises(ValueError):
            bad()


def test_node_command_line():
    run = lambda *a: subprocess.run([sys.executable, "-m", "mccl.ray.node", *a], cwd=ROOT, capture_output=True,
                                    text=True, timeout=120)
    proc = run("--address", "10.0.0.1:6379", "--ifname", "en5", "--dry-run", "--", "--num-cpus=8")
    assert proc.returncode == 0, proc.stderr
    assert "mccl 0." in proc.stdout and "device " in proc.stdout  # the machine check ran
    assert ("MCCL_SOCKET_IFNAME=en5 " in proc.stdout and "start --address=10.0.0.1:6379 "
            "'--resources={\"pool:mac\": 1}' --num-cpus=8" in proc.stdout), proc.stdout
    proc = run("--head", "--resource", "pool:studio", "--units", "2", "--dry-run")
    assert "start --head --port=6379 '--resources={\"pool:studio\": 2}'" in proc.stdout, proc.stdout
    assert run("--dry-run").returncode == 2  # --head or --address is required
