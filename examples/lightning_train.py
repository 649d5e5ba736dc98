"""Train the main job with PyTorch Lightning over MCCL: strategy "ddp_mccl", accelerator "mccl".

The module is digits_lightning.DigitsModule, the same one ray_train.py trains under Ray. Lightning's
own launcher starts the other ranks on this machine; across machines, run the same command on
each with ``--num-nodes N`` and Lightning's cluster variables (MASTER_ADDR, MASTER_PORT, NODE_RANK),
or under torchrun. On a Mac the accelerator "mccl" is the MPS device and ``--devices`` must be 1.

Rank 0 prints train.py's line per epoch (a progress bar as well when stderr is a terminal, or
with ``--progress``); Lightning's own INFO banner is left out. The training flags are train.py's.
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

import lightning as L
import torch
import torch.distributed as dist

import mccl.lightning  # noqa: F401  (registers strategy "ddp_mccl" and accelerator "mccl")
from digits_lightning import DigitsDataModule, DigitsModule, EpochTable, check_parameters_equal, quiet_lightning
from train import add_training_args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--strategy", default="ddp_mccl", help="Lightning strategy name")
    parser.add_argument("--accelerator", default="mccl",
                        help="'mccl' = this machine's device (mps, else cuda, else cpu), or a Lightning accelerator")
    parser.add_argument("--devices", type=int, default=2, help="processes on this machine (1 on a Mac)")
    parser.add_argument("--num-nodes", type=int, default=1, help="machines")
    add_training_args(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    quiet_lightning()
    torch.set_num_threads(args.threads)
    L.seed_everything(args.seed, workers=True, verbose=False)  # identical initial weights everywhere
    data = DigitsDataModule(batch_size=args.batch_size)
    module = DigitsModule(width=args.width, base_lr=args.base_lr, weight_decay=args.weight_decay,
                          warmup_epochs=args.warmup_epochs, seed=args.seed)
    trainer = L.Trainer(strategy=args.strategy, accelerator=args.accelerator, devices=args.devices,
                        num_nodes=args.num_nodes, max_epochs=args.epochs,
                        limit_train_batches=args.limit_train_batches,
                        logger=False, enable_checkpointing=False, enable_model_summary=False,
                        enable_progress_bar=args.progress, num_sanity_val_steps=0, callbacks=[EpochTable()])
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
