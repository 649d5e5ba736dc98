"""mccl.lightning: strategy "ddp_mccl" and accelerator "mccl" against Lightning's DDP over gloo, and F03.

Each multi-rank test runs Lightning the way torchrun does: every rank is its own process with
LOCAL_RANK/NODE_RANK/MASTER_* set, so Lightning's launcher does not re-execute pytest. The ranks
run under tests/python/distributed.py's deadline.
"""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.nn as nn

from distributed import check_ok, digest, run_ranks

HAS_MPS = torch.backends.mps.is_available()
STEPS = 10
BATCH = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cluster_env(rank: int, local_rank: int, node_rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_RANK=str(local_rank),
                      NODE_RANK=str(node_rank))


def _digits_like(n: int = 64) -> torch.utils.data.TensorDataset:
    gen = torch.Generator().manual_seed(7)
    return torch.utils.data.TensorDataset(torch.randn(n, 1, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen))


def _make_module(kind: str):
    import lightning as L
    import torchmetrics

    class ConvModule(L.LightningModule):
        """A small GroupNorm conv net; logs rank-dependent integer values so every synced value is exact."""

        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(1, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.ReLU(),
                nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.GroupNorm(4, 16), nn.ReLU(),
                nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
            self.total = torchmetrics.SumMetric()   # synced by torchmetrics (all_gather of states)
            self.values = torchmetrics.CatMetric()  # uneven per-rank lengths: padded all_gather

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = nn.functional.cross_entropy(self.body(x), y)
            r = self.global_rank
            self.log("rank_mean", float(r + 1), sync_dist=True)                     # mean over ranks
            self.log("rank_sum", float(r + 1), sync_dist=True, reduce_fx="sum")     # sum over ranks
            self.total.update(torch.tensor(float(r + 1)))
            if batch_idx == 0:
                self.values.update(torch.arange(r + 1, dtype=torch.float32) + 10 * r)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    class BoringModel(L.LightningModule):
        """Lightning's BoringModel (Linear 32 -> 2), as in field case F03."""

        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(32, 2)

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).sum()
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return {"conv": ConvModule, "boring": BoringModel}[kind]


def _trainer(**kw):
    import lightning as L

    return L.Trainer(max_steps=STEPS, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, num_sanity_val_steps=0, **kw)


def _fit_conv(rank: int, world_size: int, port: int, strategy, accelerator: str, precision: str = "32-true"):
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    if strategy == "ddp_mccl":
        import mccl.lightning  # noqa: F401  (registers "ddp_mccl" and "mccl")
    _cluster_env(rank, rank, 0, port)
    torch.manual_seed(0)
    module = _make_module("conv")()
    trainer = _trainer(strategy=strategy, accelerator=accelerator, devices=world_size, precision=precision)
    trainer.fit(module, DataLoader(_digits_like(), batch_size=BATCH))
    total = module.total.compute().item()        # SumMetric syncs across ranks in compute()
    values = sorted(module.values.compute().tolist())
    out = {
        "params": torch.cat([p.detach().reshape(-1) for p in module.parameters()]),
        "backend": dist.get_backend(),
        "rank_mean": trainer.callback_metrics["rank_mean"].item(),
        "rank_sum": trainer.callback_metrics["rank_sum"].item(),
        "total": total,
        "values": values,
        "steps": trainer.global_step,
        "root_device": str(trainer.strategy.root_device),
        "precision_device": getattr(trainer.strategy.precision_plugin, "device", None),
        "strategy": type(trainer.strategy).__name__,
    }
    dist.destroy_process_group()
    return out


def test_ddp_mccl_matches_gloo_bitwise_equal_and_syncs_logs_and_metrics():
    """Trainer(strategy="ddp_mccl", accelerator="cpu", devices=2), 10 steps, against strategy="ddp" over gloo."""
    ours = check_ok(run_ranks(_fit_conv, 2, free_port(), "ddp_mccl", "cpu", backend=None, deadline_s=180))
    gloo = check_ok(run_ranks(_fit_conv, 2, free_port(), "ddp", "cpu", backend=None, deadline_s=180))
    assert [o["backend"] for o in ours] == ["mccl", "mccl"]
    assert [o["strategy"] for o in ours] == ["MCCLDDPStrategy"] * 2
    assert [g["backend"] for g in gloo] == ["gloo", "gloo"]
    assert all(o["steps"] == STEPS for o in ours + gloo)
    assert digest(ours[1]["params"]) == digest(ours[0]["params"]), "ranks' weights differ bitwise"
    rel = ((ours[0]["params"] - gloo[0]["params"]).abs().max() / gloo[0]["params"].abs().max()).item()
    assert rel <= 1e-6, f"weights differ from Lightning DDP over gloo by {rel:.3g} (relative)"
    torch.manual_seed(0)
    initial = torch.cat([p.detach().reshape(-1) for p in _make_module("conv")().parameters()])
    assert (ours[0]["params"] - initial).abs().max() > 1e-3, "training did not move the weights"
    for o in ours:
        assert o["rank_mean"] == 1.5      # (1 + 2) / 2, logged with sync_dist=True
        assert o["rank_sum"] == 3.0       # reduce_fx="sum"
        assert o["total"] == STEPS * 3.0  # torchmetrics SumMetric over both ranks and 10 steps
        assert o["values"] == [0.0, 10.0, 11.0]  # CatMetric: rank 0 gave [0], rank 1 gave [10, 11]


def _counting_hook(state, bucket):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    _counting_hook.calls += 1
    return allreduce_hook(state, bucket)


_counting_hook.calls = 0


def _fit_with_mccl_accelerator(rank: int, world_size: int, port: int):
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    from mccl.lightning import MCCLDDPStrategy

    _cluster_env(rank, rank, 0, port)
    torch.manual_seed(0)
    module = _make_module("conv")()
    # Lightning builds MixedPrecision(device="cuda") for any accelerator it does not know;
    # the strategy must rebuild it for the CPU. The comm hook must be registered on the CPU too.
    trainer = _trainer(strategy=MCCLDDPStrategy(ddp_comm_hook=_counting_hook), accelerator="mccl",
                       devices=world_size, precision="bf16-mixed")
    trainer.fit(module, DataLoader(_digits_like(), batch_size=BATCH))
    out = {"params": torch.cat([p.detach().reshape(-1) for p in module.parameters()]),
           "root_device": str(trainer.strategy.root_device),
           "precision_device": trainer.strategy.precision_plugin.device,
           "hook_calls": _counting_hook.calls, "backend": dist.get_backend()}
    dist.destroy_process_group()
    return out


def test_mccl_accelerator_picks_host_device_fixes_amp_device_and_registers_comm_hooks():
    res = check_ok(run_ranks(_fit_with_mccl_accelerator, 2, free_port(), backend=None, deadline_s=180))
    expected = "mps:0" if HAS_MPS else ("cuda:" if torch.cuda.is_available() else "cpu")
    for r, o in enumerate(res):
        assert o["root_device"].startswith(expected), o
        assert o["precision_device"] == o["root_device"].split(":")[0]
        assert o["hook_calls"] >= STEPS, "the DDP comm hook was not registered on a non-CUDA device"
        assert o["backend"] == "mccl"
    assert digest(res[0]["params"]) == digest(res[1]["params"])


def test_strategy_and_accelerator_are_registered_under_their_names():
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    import mccl.lightning as ml

    assert StrategyRegistry["ddp_mccl"]["strategy"] is ml.MCCLDDPStrategy
    assert StrategyRegistry["ddp_mccl_spawn"]["init_params"] == {"start_method": "spawn"}
    assert AcceleratorRegistry["mccl"]["accelerator"] is ml.MCCLAccelerator
    strategy = StrategyRegistry.get("ddp_mccl")
    assert strategy.process_group_backend == "mccl" and strategy.determine_ddp_device_ids() is None
    with pytest.raises(ValueError, match="runs on the 'mccl' backend"):
        ml.MCCLDDPStrategy(process_group_backend="gloo")


@pytest.mark.parametrize("devices", [2, "2", [0, 1], "0,1", [1], 8])
def test_more_than_one_mps_device_per_host_is_a_clear_error(devices):
    from mccl._device import OneMPSDevicePerHostError, parse_mps_devices

    with pytest.raises(OneMPSDevicePerHostError, match="a Mac has exactly one MPS device"):
        parse_mps_devices(devices)


@pytest.mark.parametrize("devices", [1, -1, "1", "-1", "auto", [0], "0,"])
def test_one_mps_device_spellings_are_accepted(devices):
    from mccl._device import parse_mps_devices

    assert parse_mps_devices(devices) == [0]


def _fake_mac_accelerator():
    """MCCLAccelerator as it resolves on a Mac, for the Trainer wiring on hosts without MPS."""
    from mccl.lightning import MCCLAccelerator

    class OnAMac(MCCLAccelerator):
        @staticmethod
        def device_type() -> str:
            return "mps"

    return OnAMac()


def test_trainer_on_a_mac_with_devices_2_fails_before_any_process_starts():
    """F03's bad input through the real Trainer: devices=2 with the mccl accelerator on a Mac."""
    from mccl.lightning import OneMPSDevicePerHostError

    with pytest.raises(OneMPSDevicePerHostError, match="use devices=1 and num_nodes="):
        _trainer(strategy="ddp_mccl", accelerator=_fake_mac_accelerator(), devices=2)


def test_device_the_backend_cannot_carry_fails_before_the_group_exists(monkeypatch):
    """A worker whose device mccl does not carry gets one sentence naming it, before init_process_group."""
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import mccl._device

    monkeypatch.setattr(mccl._device, "DEVICES", ["cpu"])
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("NODE_RANK", "0")
    trainer = _trainer(strategy="ddp_mccl", accelerator=_fake_mac_accelerator(), devices=1, num_nodes=2)
    assert trainer.strategy.root_device == torch.device("mps", 0)
    with pytest.raises(RuntimeError, match=r"carries tensors on \['cpu'\] only, but the worker's device is mps:0"):
        trainer.fit(_make_module("boring")(), DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 32)), batch_size=2))
    assert not dist.is_initialized()


def _fit_inside_gloo_group(rank: int, world_size: int, port: int):
    from torch.utils.data import DataLoader

    import mccl.lightning  # noqa: F401

    _cluster_env(rank, rank, 0, port)
    trainer = _trainer(strategy="ddp_mccl", accelerator="cpu", devices=world_size)
    try:
        trainer.fit(_make_module("boring")(), DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 32)), batch_size=2))
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def test_existing_group_with_another_backend_is_refused():
    res = check_ok(run_ranks(_fit_inside_gloo_group, 2, free_port(), backend="gloo", deadline_s=120))
    for msg in res:
        assert "already exists with backend 'gloo'" in msg and "mccl.ray.MCCLTrainer" in msg, msg


def _f03_boring_on_mps(rank: int, world_size: int, port: int):
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    import mccl.lightning  # noqa: F401

    _cluster_env(rank, 0, rank, port)  # two "nodes" on one Mac, one process each
    torch.manual_seed(0)
    module = _make_module("boring")()
    trainer = _trainer(strategy="ddp_mccl", accelerator="mccl", devices=1, num_nodes=world_size)
    data = torch.utils.data.TensorDataset(torch.randn(64, 32, generator=torch.Generator().manual_seed(3)))
    trainer.fit(module, DataLoader(data, batch_size=BATCH))
    out = {"root": trainer.strategy.root_device.type, "weight": module.layer.weight.detach().cpu(),
           "steps": trainer.global_step}
    dist.destroy_process_group()
    return out


@pytest.mark.skipif(not HAS_MPS, reason="needs an MPS device (Apple silicon)")
def test_f03_ddp_family_on_mps_with_two_nodes():
    """F03: accelerator mccl (= mps), devices=1, num_nodes=2, BoringModel, SGD 0.1, 10 steps, batch 2."""
    res = check_ok(run_ranks(_f03_boring_on_mps, 2, free_port(), backend=None, deadline_s=180))
    assert [r["root"] for r in res] == ["mps", "mps"]
    assert [r["steps"] for r in res] == [STEPS, STEPS]
    assert digest(res[0]["weight"]) == digest(res[1]["weight"])


@pytest.mark.skipif(not HAS_MPS, reason="needs an MPS device (Apple silicon)")
def test_f03_two_mps_devices_on_one_mac_is_a_clear_error():
    import mccl.lightning as ml

    with pytest.raises(ml.OneMPSDevicePerHostError, match="a Mac has exactly one MPS device"):
        _trainer(strategy="ddp_mccl", accelerator="mccl", devices=2)


def _fit_then_validate(rank: int, world_size: int, port: int):
    import torch.distributed as dist
    import torchmetrics
    from torch.utils.data import DataLoader

    import mccl.lightning  # noqa: F401

    class Scored(_make_module("conv")):
        def __init__(self) -> None:
            super().__init__()
            self.seen = torchmetrics.CatMetric()

        def validation_step(self, batch, batch_idx):
            self.seen.update(batch[1].float())

    _cluster_env(rank, rank, 0, port)
    torch.manual_seed(0)
    module = Scored()
    trainer = _trainer(strategy="ddp_mccl", accelerator="cpu", devices=world_size, limit_train_batches=2,
                       max_epochs=1)
    data = _digits_like()
    trainer.fit(module, DataLoader(data, batch_size=BATCH))
    module.seen.reset()
    trainer.validate(module, DataLoader(data, batch_size=8), verbose=False)
    seen = sorted(module.seen.compute().tolist())  # all ranks' labels, all-gathered by torchmetrics
    out = {"seen": seen, "inference_mode": trainer.validate_loop.inference_mode,
           "labels": sorted(data.tensors[1].float().tolist())}
    dist.destroy_process_group()
    return out


def test_validate_syncs_torchmetrics_states_across_ranks():
    """Trainer.validate after fit: torchmetrics' all_gather of its states through mccl gives every
    rank every label of the (evenly sharded) validation set exactly once."""
    res = check_ok(run_ranks(_fit_then_validate, 2, free_port(), backend=None, deadline_s=180))
    for r in res:
        assert r["seen"] == r["labels"]
        assert r["inference_mode"] is True  # Lightning's default; the backend writes inference tensors


def _all_gather_under_inference_mode(rank: int, world_size: int):
    out = {}
    with torch.inference_mode():
        chunks = [torch.zeros(4) for _ in range(world_size)]
        try:
            torch.distributed.all_gather(chunks, torch.full((4,), float(rank + 1)))
            out["all_gather"] = torch.stack(chunks)
        except RuntimeError as exc:
            out["all_gather"] = str(exc)
        strided = torch.ones(4, 2)[:, 0]
        try:
            torch.distributed.all_reduce(strided)
            out["all_reduce_strided"] = strided.clone()
        except RuntimeError as exc:
            out["all_reduce_strided"] = str(exc)
    return out


def test_backend_collectives_on_inference_tensors():
    """Staged outputs (list all_gather, strided all_reduce) are copied back under the caller's
    inference mode, so inference tensors receive results (as over gloo)."""
    res = check_ok(run_ranks(_all_gather_under_inference_mode, 2, backend="mccl", deadline_s=60))
    for r in res:
        assert isinstance(r["all_gather"], torch.Tensor), r["all_gather"]
        assert torch.equal(r["all_gather"], torch.tensor([[1.0] * 4, [2.0] * 4]))
        assert isinstance(r["all_reduce_strided"], torch.Tensor), r["all_reduce_strided"]
        assert torch.equal(r["all_reduce_strided"], torch.full((4,), 2.0))


def test_lightning_example_trains_to_target_from_readme_command():
    """README: `python examples/lightning_train.py` (2 ranks via Lightning's launcher) reaches 95%."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run([sys.executable, "examples/lightning_train.py"], cwd=root, capture_output=True,
                          text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "backend=mccl strategy=MCCLDDPStrategy" in proc.stdout
    assert "parameters bitwise equal on all 2 ranks" in proc.stdout
    assert float(proc.stdout.split("final validation accuracy ")[1].split("%")[0]) >= 95.0
    # Output that is not a terminal still gets train.py's line per epoch, each once, and nothing
    # twice: no line per rank (Lightning's banner, its deprecation warning) and no progress bar.
    import re

    row = re.compile(r"^\s*(\d+)\s+\d+\.\d{4}\s+\d+\.\d{4}\s+\d+\.\d{2}%\s+\d+\s*$")
    assert [int(m.group(1)) for m in map(row.match, proc.stdout.splitlines()) if m] == list(range(1, 13)), proc.stdout
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert sorted({line for line in lines if lines.count(line) > 1}) == [], proc.stdout + proc.stderr
    assert "it/s" not in proc.stderr and "GPU available" not in proc.stderr, proc.stderr
