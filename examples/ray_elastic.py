"""Elastic training over MCCL with Ray Train: the digits job on as many machines as are free.

The job asks for a range of workers (``--min-workers`` .. ``--max-workers``), one per machine that
holds the ``pool:mac`` resource (``mccl-agent`` or ``mccl-ray-node`` start such machines). It
trains train.py's GroupNorm ResNet on the 8x8 digits with DDP over mccl and, after every epoch,
reports a checkpoint (model, AdamW state, epoch). When a machine leaves, the surviving ranks'
collectives fail at once (mccl names the peer that went away), Ray Train starts a new worker
group on the machines that remain and the loop resumes from the latest checkpoint; when machines
come back, the job grows onto them the same way within ``--resize-interval`` seconds.

What changes with the world size K: each worker keeps its batch size, so the global batch is
K x ``--batch-size``, and the learning rate follows the paper's rule ``base_lr * K**0.45``,
recomputed on every (re)start, on a warm-up + cosine schedule over epochs (not steps, whose
number per epoch depends on K). The data order is a function of (seed, epoch, K), so a restart
redoes the interrupted epoch exactly as the new group would have run it.

Run (from the repository root):

    python examples/ray_elastic.py                                # local stand-in: 3 "machines"
    python examples/ray_elastic.py --address HEAD:6379 --min-workers 4 --max-workers 24 \\
        --storage-path /Volumes/shared/ray      # checkpoints where every machine can read them

``--progress-log FILE`` appends one JSON line per step from rank 0 (attempt, world size, epoch,
step), which the elastic acceptance test reads.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import ray
import ray.train

from mccl.ray import DEFAULT_RESOURCE, MCCLTrainer, scaling_config

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--address", default=None, help="Ray cluster to join (HOST:PORT or 'auto'); default: a local one")
    p.add_argument("--min-workers", type=int, default=2, help="fewest machines the job runs on")
    p.add_argument("--max-workers", type=int, default=3, help="most machines the job runs on")
    p.add_argument("--resource", default=DEFAULT_RESOURCE, help="custom resource each machine holds one unit of")
    p.add_argument("--resize-interval", type=float, default=60.0,
                   help="seconds between looks for machines that joined (each growth is a restart)")
    p.add_argument("--max-failures", type=int, default=10,
                   help="restarts allowed for machines that left without draining (-1: unlimited)")
    p.add_argument("--placement-timeout", type=float, default=None,
                   help="seconds a worker group may wait to be placed before the attempt is retried "
                        "(default: MCCLTrainer's for elastic jobs, 30)")
    p.add_argument("--storage-path", default=None, help="where checkpoints go (shared storage on a fleet)")
    p.add_argument("--name", default="mccl-digits-elastic", help="run name (a run of this name resumes)")
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch size")
    p.add_argument("--base-lr", type=float, default=4e-4, help="single-worker learning rate")
    p.add_argument("--width", type=float, default=1.0, help="channel width multiplier")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per worker")
    p.add_argument("--timeout", type=float, default=60.0, help="mccl collective timeout in seconds")
    p.add_argument("--step-delay", type=float, default=0.0, help="sleep after every step (to stretch epochs)")
    p.add_argument("--progress-log", default=None, help="rank 0 appends a JSON line per step here")
    p.add_argument("--target-acc", type=float, default=0.95, help="exit non-zero below this final accuracy")
    return p.parse_args(argv)


def lr_at(progress: float, epochs: int, warmup_epochs: float = 1.0) -> float:
    """Warm-up then cosine decay, as a function of the fraction of epochs done."""
    e = progress * epochs
    if e < warmup_epochs:
        return (e + 1e-3) / warmup_epochs
    return 0.5 * (1.0 + math.cos(math.pi * (e - warmup_epochs) / max(1e-9, epochs - warmup_epochs)))


def train_loop(config: dict) -> None:
    """Runs on every worker inside Ray Train's mccl process group, from the latest checkpoint."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler, Subset

    from train import GroupNormResNet, differing_ranks, evaluate, load_data, random_shift

    torch.set_num_threads(config["threads"])
    ctx = ray.train.get_context()
    rank, world = dist.get_rank(), dist.get_world_size()
    train_set, test_set, fill = load_data()
    torch.manual_seed(config["seed"])
    model = GroupNormResNet(config["width"])
    peak = config["base_lr"] * world ** 0.45
    opt = torch.optim.AdamW(model.parameters(), lr=peak, weight_decay=0.05)
    start_epoch, resumed_from = 0, None
    ckpt = ray.train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start_epoch, resumed_from = state["epoch"] + 1, state["epoch"]
    ddp = DistributedDataParallel(model)
    sampler = DistributedSampler(train_set, num_replicas=world, rank=rank, shuffle=True, seed=config["seed"])
    loader = DataLoader(train_set, batch_size=config["batch_size"], sampler=sampler)
    test_loader = DataLoader(Subset(test_set, range(rank, len(test_set), world)), batch_size=256)
    augment = torch.Generator().manual_seed(config["seed"] * 1000 + rank)
    log = open(config["progress_log"], "a") if config.get("progress_log") and rank == 0 else None
    attempt = f"{os.getpid()}-{time.time():.0f}"
    if rank == 0:
        print(f"worker group of {world}: epochs {start_epoch}..{config['epochs'] - 1}"
              + (f", resumed from the checkpoint of epoch {resumed_from}" if resumed_from is not None else "")
              + f", lr {peak:.2e}", flush=True)
    epochs = config["epochs"]
    for epoch in range(start_epoch, epochs):
        sampler.set_epoch(epoch)
        augment.manual_seed(config["seed"] * 1000 + rank + 7919 * epoch)
        ddp.train()
        totals = torch.zeros(2, dtype=torch.float64)
        for step, (x, y) in enumerate(loader):
            for g in opt.param_groups:
                g["lr"] = peak * lr_at((epoch + step / len(loader)) / epochs, epochs)
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(random_shift(x, fill, augment)), y)
            loss.backward()
            opt.step()
            totals += torch.tensor([loss.item() * len(y), len(y)], dtype=torch.float64)
            if log:
                log.write(json.dumps({"attempt": attempt, "world": world, "epoch": epoch, "step": step,
                                      "steps": len(loader), "time": time.time()}) + "\n")
                log.flush()
            if config["step_delay"]:
                time.sleep(config["step_delay"])
        dist.all_reduce(totals)
        val_loss, val_acc = evaluate(ddp, test_loader)
        metrics = {"epoch": epoch, "train_loss": (totals[0] / totals[1]).item(), "val_loss": val_loss,
                   "val_acc": val_acc, "world_size": world}
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "epoch": epoch},
                           os.path.join(tmp, "state.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(tmp)
                print(f"epoch {epoch + 1:>3}/{epochs} on {world} workers: train_loss {metrics['train_loss']:.4f} "
                      f"val_loss {val_loss:.4f} val_acc {val_acc:.2%}", flush=True)
            ray.train.report(metrics, checkpoint=checkpoint)
    bad = differing_ranks(ddp.module, world)
    if bad:
        raise RuntimeError(f"parameters differ from rank 0 on ranks {bad}")
    if rank == 0:
        print(f"parameters bitwise equal on all {world} workers (world rank {ctx.get_world_rank()})", flush=True)
        if log:
            log.write(json.dumps({"done": True, "world": world, "time": time.time()}) + "\n")
            log.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runtime_env = {"working_dir": HERE, "excludes": ["__pycache__"]}
    if args.address:
        ray.init(address=args.address, runtime_env=runtime_env)
    else:  # a one-machine Ray standing in for --max-workers machines
        ray.init(address="local", num_cpus=args.max_workers, resources={args.resource: args.max_workers},
                 object_store_memory=100 * 1024**2, include_dashboard=False, runtime_env=runtime_env)
    config = {k: getattr(args, k) for k in ("epochs", "batch_size", "base_lr", "width", "seed", "threads",
                                            "step_delay", "progress_log")}
    try:
        trainer = MCCLTrainer(
            train_loop, train_loop_config=config,
            scaling_config=scaling_config((args.min_workers, args.max_workers), resource=args.resource,
                                          resize_interval_s=args.resize_interval),
            torch_config=ray.train.torch.TorchConfig(timeout_s=int(args.timeout)),
            run_config=ray.train.RunConfig(name=args.name,
                                           storage_path=args.storage_path or tempfile.mkdtemp(prefix="mccl-ray-"),
                                           failure_config=ray.train.FailureConfig(max_failures=args.max_failures)),
            resource=args.resource, placement_timeout_s=args.placement_timeout)
        result = trainer.fit()
    finally:
        ray.shutdown()
    metrics = result.metrics or {}
    val_acc = float(metrics.get("val_acc", 0.0))
    print(f"final: epoch {metrics.get('epoch')} on {metrics.get('world_size')} workers, "
          f"val_loss {metrics.get('val_loss', float('nan')):.4f}")
    print(f"final validation accuracy {val_acc:.2%} (target {args.target_acc:.2%})", flush=True)
    return 0 if val_acc >= args.target_acc else 1


if __name__ == "__main__":
    sys.exit(main())
