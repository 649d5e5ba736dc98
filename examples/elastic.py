"""Elastic restart over MCCL: checkpoint, crash, resume under ``torchrun --max-restarts``.

A small MLP learns a fixed synthetic regression task with DistributedDataParallel over MCCL and
SGD with momentum. Every ``--ckpt-every`` steps rank 0 writes a checkpoint (model, optimizer state
including momentum, the step) atomically as ``ckpt-<step>.pt`` and points ``latest`` at it. On
start, every rank resumes from ``latest`` if there is one. The batch of every step is a pure
function of (step, rank), so a resumed run sees exactly the data an uninterrupted one would have,
and the loss trajectory after a restart is bitwise the one of a run that never crashed.

``--crash-at STEP --crash-rank R`` injects a crash: in the first attempt only
(``TORCHELASTIC_RESTART_COUNT`` 0), rank R SIGKILLs itself in the middle of step STEP, after its
forward pass, while the other ranks wait in DDP's gradient all-reduce. Their all-reduce fails, the
torchrun agent stops the attempt and starts a new one, which re-initialises the process group on
fresh store keys (MCCL's per-init generation; it never dials the dead attempt's endpoints), loads
the last checkpoint and finishes.

    torchrun --standalone --nproc-per-node 4 --max-restarts 1 examples/elastic.py \\
        --ckpt-dir /tmp/elastic --crash-at 17 --crash-rank 2

Rank 0 appends one JSON line per step to ``<ckpt-dir>/losses.jsonl``: attempt, step, the global
mean loss (as ``float.hex``, to compare bitwise) and, at the end, a digest of the parameters.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import mccl  # noqa: F401  (registers the "mccl" backend)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Checkpointed DDP training that survives a crashed rank "
                                            "under torchrun --max-restarts.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--ckpt-dir", required=True, help="checkpoints and losses.jsonl go here")
    p.add_argument("--steps", type=int, default=30, help="training steps in all")
    p.add_argument("--ckpt-every", type=int, default=5, help="checkpoint after every N steps")
    p.add_argument("--crash-at", type=int, default=-1, help="step in which --crash-rank dies (first attempt only)")
    p.add_argument("--crash-rank", type=int, default=-1, help="rank that dies at --crash-at")
    p.add_argument("--batch", type=int, default=64, help="per-rank batch size")
    p.add_argument("--lr", type=float, default=0.05, help="SGD learning rate")
    p.add_argument("--backend", default="mccl", help="torch.distributed backend")
    p.add_argument("--timeout", type=float, default=60, help="process-group timeout in seconds")
    return p.parse_args(argv)


def batch(step: int, rank: int, size: int):
    """The batch of ``rank`` at ``step``: the same in every attempt."""
    g = torch.Generator().manual_seed(1_000_003 * step + rank)
    x = torch.randn(size, 16, generator=g)
    w = torch.linspace(-1, 1, 16)
    y = (x @ w).unsqueeze(1) + 0.1 * torch.sin(3 * x[:, :1])
    return x, y


def digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_checkpoint(ckpt_dir: str, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """Rank 0: ckpt-<step>.pt, then `latest` names it (each through a rename: never half-written)."""
    path = os.path.join(ckpt_dir, f"ckpt-{step}.pt")
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, path + ".tmp")
    os.replace(path + ".tmp", path)
    with open(os.path.join(ckpt_dir, "latest.tmp"), "w") as f:
        f.write(os.path.basename(path))
    os.replace(os.path.join(ckpt_dir, "latest.tmp"), os.path.join(ckpt_dir, "latest"))


def load_checkpoint(ckpt_dir: str):
    latest = os.path.join(ckpt_dir, "latest")
    if not os.path.exists(latest):
        return None
    with open(latest) as f:
        return torch.load(os.path.join(ckpt_dir, f.read().strip()), weights_only=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    os.makedirs(args.ckpt_dir, exist_ok=True)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = 0
    ckpt = load_checkpoint(args.ckpt_dir)
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start = ckpt["step"] + 1
    ddp = DistributedDataParallel(model)
    log = open(os.path.join(args.ckpt_dir, "losses.jsonl"), "a") if rank == 0 else None
    if rank == 0:
        print(f"attempt {attempt}: {dist.get_world_size()} ranks, steps {start}..{args.steps - 1}"
              + (f" (resumed from the checkpoint of step {start - 1})" if start else ""), flush=True)

    for step in range(start, args.steps):
        x, y = batch(step, rank, args.batch)
        loss = nn.functional.mse_loss(ddp(x), y)
        if attempt == 0 and step == args.crash_at and rank == args.crash_rank:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-step: the others are about to all-reduce
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= dist.get_world_size()
        if rank == 0:
            log.write(json.dumps({"attempt": attempt, "step": step, "loss": float(mean).hex()}) + "\n")
            log.flush()
        if (step + 1) % args.ckpt_every == 0:
            if rank == 0:
                save_checkpoint(args.ckpt_dir, step, model, opt)
            dist.barrier()  # nobody runs ahead of a checkpoint that is not on disk yet
    if rank == 0:
        log.write(json.dumps({"attempt": attempt, "final": digest(model)}) + "\n")
        log.close()
        print(f"attempt {attempt}: finished step {args.steps - 1}, final loss {float(mean):.6f}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
