"""Train the main job with PyTorch Lightning over MCCL: strategy "ddp_mccl", accelerator "mccl".

The module is digits_lightning.DigitsModule, the same one ray_train.py trains under Ray. Lightning's
own launcher starts the other ranks on this machine; across machines, run the same command on
each with ``--num-nodes N`` and Lightning's cluster variables (MASTER_ADDR, MASTER_PORT, NODE_RANK),
or under torchrun. On a Mac the accelerator "mccl" is the MPS device and ``--devices`` must be 1.

At the end every rank all-gathers the raw bits of its parameters; rank 0 prints whether they are
equal on all ranks and the final validation accuracy. The script exits non-zero if they differ or
the accuracy is below ``--target-acc``.

Run (from the repository root):

    python examples/lightning_train.py                                # 2 ranks on this machine
    python examples/lightning_train.py --strategy ddp --accelerator cpu  # Lightning's DDP over gloo
    torchrun --nnodes 2 --node-rank R --master-addr HOST --nproc-per-node 1 examples/lightning_train.py --devices 1 --num-nodes 2
"""
from __future__ import annotations

import argparse
import sys

import lightning as L
import torch
import torch.distributed as dist

import mccl.lightning  # noqa: F401  (registers strategy "ddp_mccl" and accelerator "mccl")
from digits_lightning import DigitsDataModule, DigitsModule, check_parameters_equal


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--strategy", default="ddp_mccl", help="Lightning strategy name")
    parser.add_argument("--accelerator", default="mccl",
                        help="'mccl' = this machine's device (mps, else cuda, else cpu), or a Lightning accelerator")
    parser.add_argument("--devices", type=int, default=2, help="processes on this machine (1 on a Mac)")
    parser.add_argument("--num-nodes", type=int, default=1, help="machines")
    parser.add_argument("--epochs", type=int, default=12, help="training epochs")
    parser.add_argument("--limit-train-batches", type=int, default=None,
                        help="training steps per epoch (default: the whole training split)")
    parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--base-lr", type=float, default=4e-4, help="single-rank learning rate")
    parser.add_argument("--width", type=float, default=1.0, help="channel width multiplier")
    parser.add_argument("--seed", type=int, default=0, help="seed for model init and data order")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    parser.add_argument("--target-acc", type=float, default=0.95,
                        help="exit non-zero if the final validation accuracy is below this")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=sys.stderr.isatty(),
                        help="show Lightning's progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    L.seed_everything(args.seed, workers=True, verbose=False)  # identical initial weights everywhere
    data = DigitsDataModule(batch_size=args.batch_size)
    module = DigitsModule(width=args.width, base_lr=args.base_lr, seed=args.seed)
    trainer = L.Trainer(strategy=args.strategy, accelerator=args.accelerator, devices=args.devices,
                        num_nodes=args.num_nodes, max_epochs=args.epochs,
                        limit_train_batches=args.limit_train_batches,
                        logger=False, enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=args.progress, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=data)
    val_acc = float(trainer.callback_metrics["val_acc"])  # validated after the last epoch: final weights
    bad = check_parameters_equal(module, trainer.world_size)
    if trainer.is_global_zero:
        print(f"backend={dist.get_backend()} strategy={type(trainer.strategy).__name__} "
              f"device={trainer.strategy.root_device} world_size={trainer.world_size} steps={trainer.global_step}")
        print(f"parameters differ from rank 0 on ranks {bad}" if bad else
              f"parameters bitwise equal on all {trainer.world_size} ranks")
        print(f"final validation accuracy {val_acc:.2%} (target {args.target_acc:.2%})", flush=True)
    dist.destroy_process_group()
    if bad or val_acc < args.target_acc:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
