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

Run (from the repository root):

    python examples/ray_train.py                                     # local stand-in for 2 machines
    python examples/ray_train.py --address HEAD:6379 --num-workers 4 --storage-path /shared/ray
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import ray
import ray.train

from mccl.ray import DEFAULT_RESOURCE, MCCLTrainer, scaling_config

HERE = os.path.dirname(os.path.abspath(__file__))


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
                        help="where Ray keeps results and checkpoints (shared storage on a real fleet)")
    parser.add_argument("--epochs", type=int, default=12, help="training epochs")
    parser.add_argument("--limit-train-batches", type=int, default=None,
                        help="training steps per epoch (default: the whole training split)")
    parser.add_argument("--batch-size", type=int, default=32, help="per-worker batch size")
    parser.add_argument("--base-lr", type=float, default=4e-4, help="single-worker learning rate")
    parser.add_argument("--width", type=float, default=1.0, help="channel width multiplier")
    parser.add_argument("--seed", type=int, default=0, help="seed for model init and data order")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    parser.add_argument("--target-acc", type=float, default=0.95,
                        help="exit non-zero if the final validation accuracy is below this")
    return parser.parse_args(argv)


def train_loop(config: dict) -> None:
    """Runs on every worker, inside Ray Train's mccl process group."""
    import lightning as L
    import torch
    import torch.distributed as dist
    from ray.train.lightning import RayLightningEnvironment, RayTrainReportCallback, prepare_trainer

    import mccl.lightning  # noqa: F401  (registers accelerator "mccl")
    from digits_lightning import DigitsDataModule, DigitsModule, check_parameters_equal
    from mccl.ray.lightning import RayMCCLStrategy

    torch.set_num_threads(config["threads"])
    L.seed_everything(config["seed"], workers=True, verbose=False)
    data = DigitsDataModule(batch_size=config["batch_size"])
    module = DigitsModule(width=config["width"], base_lr=config["base_lr"], seed=config["seed"])
    trainer = L.Trainer(accelerator=config["accelerator"], devices=1, strategy=RayMCCLStrategy(),
                        plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
                        max_epochs=config["epochs"], limit_train_batches=config["limit_train_batches"],
                        logger=False, enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=False, num_sanity_val_steps=0)
    trainer = prepare_trainer(trainer)
    trainer.fit(module, datamodule=data)
    bad = check_parameters_equal(module, trainer.world_size)
    if bad:
        raise RuntimeError(f"parameters differ from rank 0 on ranks {bad}")
    if trainer.is_global_zero:
        print(f"backend={dist.get_backend()} strategy={type(trainer.strategy).__name__} "
              f"device={trainer.strategy.root_device} world_size={trainer.world_size} steps={trainer.global_step}")
        print(f"parameters bitwise equal on all {trainer.world_size} workers", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    runtime_env = {"working_dir": HERE, "excludes": ["__pycache__"]}
    if args.address:
        ray.init(address=args.address, runtime_env=runtime_env)
    else:  # a new one-machine Ray standing in for --num-workers machines, never one found running here
        ray.init(address="local", num_cpus=args.num_workers, resources={args.resource: args.num_workers},
                 object_store_memory=100 * 1024**2, include_dashboard=False, runtime_env=runtime_env)
    try:
        config = {k: getattr(args, k) for k in ("accelerator", "epochs", "limit_train_batches", "batch_size",
                                                "base_lr", "width", "seed", "threads")}
        trainer = MCCLTrainer(
            train_loop, train_loop_config=config,
            scaling_config=scaling_config(args.num_workers, resource=args.resource),
            run_config=ray.train.RunConfig(name="mccl-digits",
                                           storage_path=args.storage_path or tempfile.mkdtemp(prefix="mccl-ray-")),
            resource=args.resource, placement_timeout_s=args.placement_timeout)
        result = trainer.fit()
    finally:
        ray.shutdown()
    metrics = result.metrics or {}
    print(f"final metrics: train_loss_epoch={metrics.get('train_loss_epoch', float('nan')):.4f} "
          f"val_loss={metrics.get('val_loss', float('nan')):.4f} step={metrics.get('step')}")
    val_acc = float(metrics.get("val_acc", 0.0))
    print(f"final validation accuracy {val_acc:.2%} (target {args.target_acc:.2%})", flush=True)
    if val_acc < args.target_acc:
        sys.exit(1)


if __name__ == "__main__":
    main()
