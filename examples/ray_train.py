"""Train the main job with Lightning inside Ray Train over MCCL, one worker per machine.

The LightningModule is digits_lightning.DigitsModule, the same one lightning_train.py trains. Ray
places one worker on every machine that advertises the custom resource (``pool:mac`` unless
``--resource``; ``mccl-ray-node`` starts such machines), the process group is mccl's, and each
worker trains on its machine's device (MPS on a Mac) with ``RayMCCLStrategy`` through
``ray.train.lightning.prepare_trainer``. This directory is shipped to the workers as the job's
working_dir, so the machines need mccl installed, not this script.

Without ``--address`` the script starts a one-machine Ray with ``--num-workers`` units of the
resource, a stand-in for that many machines. The script exits non-zero if the workers' parameters
differ at the end or the final validation accuracy is below ``--target-acc``.

Output: rank 0's worker prints train.py's line per epoch (Ray prefixes it with the worker's pid);
Ray's own INFO lines about the controller and the worker group appear once each. The job's
processes get QUIET_WORKER_ENV (one line per print, no Lightning or matplotlib INFO) and drop
one known warning (STATE_API_NOISE, explained below). Results and checkpoints go to a temporary
folder that is removed at the end unless ``--storage-path`` names one. The training flags are
train.py's (``--progress`` is off by default here: a worker's bar would reach the driver as one
line per update).

Run (from the repository root):

    python examples/ray_train.py                                     # local stand-in for 2 machines
    python examples/ray_train.py --address HEAD:6379 --num-workers 4 --storage-path /shared/ray
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from contextlib import ExitStack

import ray
import ray.train

from mccl.ray import DEFAULT_RESOURCE, MCCLTrainer, scaling_config
from train import add_training_args

HERE = os.path.dirname(os.path.abspath(__file__))

#: Environment of every process of the job, unless the driver's environment says otherwise.
#: Ray Train's workers send each print() through a logger of Ray Train's as well as to stdout, and
#: give the root logger a console handler of their own: every line of a worker reached the driver
#: twice, and Lightning's and matplotlib's INFO lines came along. With these, a print is one line
#: and logging is as the script sets it up.
QUIET_WORKER_ENV = {"RAY_TRAIN_ENABLE_PRINT_PATCH": "0", "RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING": "0"}
#: The local stand-in also turns off Ray Train's preemption watcher (it polls for nodes being
#: drained, which one machine never is; starting it logs an error-level note about its actor).
LOCAL_ONLY_ENV = {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
#: Logged every second or two by Ray Train's placement-group cleaner, an actor that asks Ray's State
#: API whether the training controller is still alive, when the cluster has no dashboard (the
#: local stand-in starts none; `ray start --include-dashboard=false` neither): the State API is
#: served by the dashboard, so every query fails. The cleaner only matters when the controller dies
#: without removing its placement group; ray.shutdown() removes it here in any case.
STATE_API_NOISE = "Failed to query Ray Train Controller actor state"


def quiet_worker_process() -> None:
    """Runs first in every process of the job (the runtime environment's
    ``worker_process_setup_hook``): drops the placement-group cleaner's STATE_API_NOISE, and points
    the State API at this job's own cluster (RAY_ADDRESS): with a second Ray running on the same
    machine it would otherwise pick "the latest cluster" and warn "Found multiple active Ray
    instances" at every query."""
    import logging

    os.environ.setdefault("RAY_ADDRESS", ray.get_runtime_context().gcs_address)

    class DropStateApiNoise(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return STATE_API_NOISE not in record.getMessage()

    logging.getLogger("ray.train.v2._internal.execution.controller.placement_group_cleaner").addFilter(
        DropStateApiNoise())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--address", default=None,
                        help="Ray cluster to join (HOST:PORT or 'auto'); default: start a local one")
    parser.add_argument("--num-workers", type=int, default=2, help="workers, one per machine")
    parser.add_argument("--resource", default=DEFAULT_RESOURCE, help="custom resource each machine holds one unit of")
    parser.add_argument("--accelerator", default="mccl",
                        help="'mccl' = each machine's device (mps, else cuda, else cpu), or a Lightning accelerator")
    parser.add_argument("--placement-timeout", type=float, default=60.0,
                        help="seconds the workers may wait to be placed before the job fails")
    parser.add_argument("--storage-path", default=None,
                        help="where Ray keeps results and checkpoints (shared storage on a real fleet); "
                             "default: a temporary folder, removed at the end")
    add_training_args(parser, progress_default=False)  # a worker's bar reaches the driver line by line
    return parser.parse_args(argv)


def train_loop(config: dict) -> None:
    """Runs on every worker, inside Ray Train's mccl process group."""
    import logging
    import shutil

    import lightning as L
    import torch
    import torch.distributed as dist
    from ray.train.lightning import RayLightningEnvironment, RayTrainReportCallback, prepare_trainer

    import mccl.lightning  # noqa: F401  (registers accelerator "mccl")
    from digits_lightning import DigitsDataModule, DigitsModule, EpochTable, check_parameters_equal, quiet_lightning
    from mccl.ray.lightning import RayMCCLStrategy

    quiet_lightning()
    logging.getLogger("ray.train").setLevel(logging.WARNING)  # no INFO line per checkpoint and report
    torch.set_num_threads(config["threads"])
    L.seed_everything(config["seed"], workers=True, verbose=False)
    data = DigitsDataModule(batch_size=config["batch_size"])
    module = DigitsModule(width=config["width"], base_lr=config["base_lr"], weight_decay=config["weight_decay"],
                          warmup_epochs=config["warmup_epochs"], seed=config["seed"])
    report = RayTrainReportCallback()
    trainer = L.Trainer(accelerator=config["accelerator"], devices=1, strategy=RayMCCLStrategy(),
                        plugins=[RayLightningEnvironment()], callbacks=[report, EpochTable()],
                        max_epochs=config["epochs"], limit_train_batches=config["limit_train_batches"],
                        logger=False, enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=config["progress"], num_sanity_val_steps=0)
    trainer = prepare_trainer(trainer)
    try:
        trainer.fit(module, datamodule=data)
    finally:  # Ray's callback stages each checkpoint under this folder and leaves the folder behind
        shutil.rmtree(getattr(report, "tmpdir_prefix", ""), ignore_errors=True)
    bad = check_parameters_equal(module, trainer.world_size)
    if bad:
        raise RuntimeError(f"parameters differ from rank 0 on ranks {bad}")
    if trainer.is_global_zero:
        print(f"backend={dist.get_backend()} strategy={type(trainer.strategy).__name__} "
              f"device={trainer.strategy.root_device} world_size={trainer.world_size} steps={trainer.global_step}")
        print(f"parameters bitwise equal on all {trainer.world_size} workers", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    env = {k: os.environ.get(k, v) for k, v in {**QUIET_WORKER_ENV, **({} if args.address else LOCAL_ONLY_ENV)}.items()}
    runtime_env = {"working_dir": HERE, "excludes": ["__pycache__"], "env_vars": env,
                   "worker_process_setup_hook": quiet_worker_process}
    with ExitStack() as cleanup:
        # Results and checkpoints (a few MB) go to a temporary folder that is removed at the end,
        # unless --storage-path keeps them.
        storage = args.storage_path or cleanup.enter_context(tempfile.TemporaryDirectory(prefix="mccl-ray-"))
        if args.address:
            ray.init(address=args.address, runtime_env=runtime_env)
        else:  # a new one-machine Ray standing in for --num-workers machines, never one found running here
            ray.init(address="local", num_cpus=args.num_workers, resources={args.resource: args.num_workers},
                     object_store_memory=100 * 1024**2, include_dashboard=False, runtime_env=runtime_env)
        cleanup.callback(ray.shutdown)  # before the folder goes: Ray's processes may still write there
        config = {k: getattr(args, k) for k in ("accelerator", "epochs", "limit_train_batches", "batch_size",
                                                "base_lr", "weight_decay", "warmup_epochs", "width", "seed",
                                                "threads", "progress")}
        trainer = MCCLTrainer(
            train_loop, train_loop_config=config,
            scaling_config=scaling_config(args.num_workers, resource=args.resource),
            run_config=ray.train.RunConfig(name="mccl-digits", storage_path=storage),
            resource=args.resource, placement_timeout_s=args.placement_timeout)
        result = trainer.fit()
    metrics = result.metrics or {}
    print(f"final metrics: train_loss_epoch={metrics.get('train_loss_epoch', float('nan')):.4f} "
          f"val_loss={metrics.get('val_loss', float('nan')):.4f} step={metrics.get('step')}")
    val_acc = float(metrics.get("val_acc", 0.0))
    print(f"final validation accuracy {val_acc:.2%} (target {args.target_acc:.2%})", flush=True)
    if val_acc < args.target_acc:
        sys.exit(1)


if __name__ == "__main__":
    main()
