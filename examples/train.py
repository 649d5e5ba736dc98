"""Train a GroupNorm ResNet with DistributedDataParallel over MCCL (or Gloo).

This is MCCL's end-to-end demo and check. Every rank trains a small residual network with
GroupNorm (a scaled-down version of the paper's GroupNorm ResNet for CIFAR-10) on scikit-learn's
bundled handwritten-digits dataset (1797 8x8 greyscale images, 10 classes; no download needed),
using a fixed stratified 80/20 train/test split. Gradients are averaged by DDP through the chosen
torch.distributed backend; AdamW's learning rate follows the paper's rule
``lr = base_lr * K**0.45`` for K ranks, reached after a short warm-up and then decayed on a
cosine schedule.

Each epoch, rank 0 prints one line with the global training loss, the exact global validation
loss and accuracy (sums all-reduced in float64/int64) and the global training throughput in
samples/s, with a progress bar in between when stderr is a terminal (``--progress`` and
``--no-progress`` decide otherwise). At the end the script all-gathers the raw bits of every
rank's parameters and checks that they are bitwise equal, prints the final validation accuracy,
and exits non-zero if the parameters differ or the accuracy is below ``--target-acc``. The flags
that shape the job are add_training_args' and the same in lightning_train.py and ray_train.py.

Run (from the repository root):

    torchrun --standalone --nproc-per-node 4 examples/train.py               # MCCL backend
    torchrun --standalone --nproc-per-node 4 examples/train.py --backend gloo
    python examples/train.py --help
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset
from tqdm import tqdm

NUM_CLASSES = 10
PIXEL_MAX = 16.0  # load_digits pixels are integers in 0..16.


def add_training_args(parser: argparse.ArgumentParser, *, progress_default: bool | None = None) -> None:
    """The flags every example takes (train.py, lightning_train.py, ray_train.py), so the same
    command line trains the same job under each. ``progress_default`` None: on when stderr is a
    terminal. Whatever it is, rank 0 prints one line per epoch."""
    parser.add_argument("--epochs", type=int, default=12, help="training epochs")
    parser.add_argument("--limit-train-batches", type=int, default=None,
                        help="training steps per epoch (None: the whole training split)")
    parser.add_argument("--batch-size", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--base-lr", type=float, default=4e-4,
                        help="single-rank learning rate; the peak lr is base_lr * K**0.45")
    parser.add_argument("--weight-decay", type=float, default=0.05, help="AdamW weight decay")
    parser.add_argument("--warmup-epochs", type=float, default=1.0,
                        help="linear learning-rate warm-up length before the cosine decay")
    parser.add_argument("--width", type=float, default=1.0,
                        help="channel width multiplier (1.0 = widths 32/64/128)")
    parser.add_argument("--seed", type=int, default=0, help="seed for model init and data order")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads per rank (ranks share the machine's cores)")
    parser.add_argument("--target-acc", type=float, default=0.95,
                        help="exit non-zero if the final validation accuracy is below this")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction,
                        default=sys.stderr.isatty() if progress_default is None else progress_default,
                        help="show a progress bar within each epoch (here: %(default)s; without either flag, on "
                             "when stderr is a terminal); the per-epoch lines are printed either way")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a GroupNorm ResNet on sklearn's digits with DDP over MCCL or Gloo.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--backend", default="mccl", choices=["mccl", "gloo"],
                        help="torch.distributed backend")
    add_training_args(parser)
    return parser.parse_args()


def group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(num_groups=min(8, channels), num_channels=channels)


class BasicBlock(nn.Module):
    """ResNet basic block (two 3x3 convs) with GroupNorm and a projection shortcut if needed."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.norm1 = group_norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.norm2 = group_norm(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                group_norm(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class GroupNormResNet(nn.Module):
    """Stem conv, three residual stages (8x8 -> 4x4 -> 2x2), global average pool, linear head."""

    def __init__(self, width: float = 1.0, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        c1, c2, c3 = (max(8, round(c * width)) for c in (32, 64, 128))
        self.stem = nn.Sequential(nn.Conv2d(1, c1, 3, 1, 1, bias=False), group_norm(c1),
                                  nn.ReLU())
        self.stages = nn.Sequential(
            BasicBlock(c1, c1),
            BasicBlock(c1, c2, stride=2),
            BasicBlock(c2, c3, stride=2),
        )
        self.head = nn.Linear(c3, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def load_data() -> tuple[TensorDataset, TensorDataset, float]:
    """Train and test digits as (N, 1, 8, 8) tensors standardised with the train split's pixel
    mean and std, plus the standardised value of a blank (0) pixel."""
    digits = load_digits()
    images = digits.images.astype(np.float32) / PIXEL_MAX
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target, test_size=0.2, random_state=0, stratify=digits.target)
    mean, std = float(x_train.mean()), float(x_train.std())

    def to_dataset(x: np.ndarray, y: np.ndarray) -> TensorDataset:
        x_norm = torch.from_numpy((x - mean) / std).unsqueeze(1)
        return TensorDataset(x_norm, torch.from_numpy(y).long())

    background = (0.0 - mean) / std
    return to_dataset(x_train, y_train), to_dataset(x_test, y_test), background


def random_shift(x: torch.Tensor, fill: float, generator: torch.Generator) -> torch.Tensor:
    """Shift each image by a random offset in {-1, 0, 1} along each axis, filling with `fill`."""
    n, _, h, w = x.shape
    padded = F.pad(x, (1, 1, 1, 1), value=fill)
    dy = torch.randint(0, 3, (n, 1), generator=generator)
    dx = torch.randint(0, 3, (n, 1), generator=generator)
    rows = (dy + torch.arange(h))[:, :, None]  # (n, h, 1)
    cols = (dx + torch.arange(w))[:, None, :]  # (n, 1, w)
    return padded[torch.arange(n)[:, None, None], 0, rows, cols].unsqueeze(1)


def lr_factor(step: int, warmup_steps: int, total_steps: int) -> float:
    """Linear warm-up to 1, then cosine decay to 0."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def train_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer,
                scheduler: torch.optim.lr_scheduler.LRScheduler, fill: float,
                generator: torch.Generator, progress: tqdm, limit: int | None = None) -> float:
    """One pass over this rank's shard (its first ``limit`` batches if given); returns the mean
    training loss over all ranks."""
    model.train()
    totals = torch.zeros(2, dtype=torch.float64)  # [loss sum, sample count]
    for step, (x, y) in enumerate(loader):
        if limit is not None and step >= limit:
            break
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(random_shift(x, fill, generator)), y)
        loss.backward()
        optimizer.step()
        scheduler.step()
        totals += torch.tensor([loss.item() * len(y), len(y)], dtype=torch.float64)
        progress.update(1)
        progress.set_postfix(loss=f"{loss.item():.3f}", lr=f"{scheduler.get_last_lr()[0]:.2e}")
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    return (totals[0] / totals[1]).item()


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader) -> tuple[float, float]:
    """Global (loss, accuracy) over the test split, from sums all-reduced exactly across ranks."""
    model.eval()
    loss_sum = torch.zeros(1, dtype=torch.float64)
    counts = torch.zeros(2, dtype=torch.int64)  # [correct, total]
    for x, y in loader:
        logits = model(x)
        loss_sum += F.cross_entropy(logits, y, reduction="sum").double()
        counts[0] += (logits.argmax(1) == y).sum()
        counts[1] += len(y)
    dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    total = int(counts[1])
    return loss_sum.item() / total, int(counts[0]) / total


def differing_ranks(model: nn.Module, world_size: int) -> list[int]:
    """All-gather every rank's parameter bytes; return the ranks that differ from rank 0's."""
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    local = flat.view(torch.int32)  # compare raw bits, so -0.0 vs 0.0 or NaN payloads count
    gathered = torch.empty(world_size * local.numel(), dtype=torch.int32)
    dist.all_gather_single(gathered, local)
    shards = gathered.view(world_size, -1)
    return [r for r in range(1, world_size) if not torch.equal(shards[r], shards[0])]


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    if args.backend == "mccl":
        import mccl  # noqa: F401  (importing registers the "mccl" backend)
    dist.init_process_group(backend=args.backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    is_main = rank == 0

    train_set, test_set, fill = load_data()
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed, drop_last=False)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    # Strided, unpadded shards, so every test sample is counted exactly once.
    test_shard = Subset(test_set, range(rank, len(test_set), world_size))
    test_loader = DataLoader(test_shard, batch_size=256)

    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = DistributedDataParallel(GroupNormResNet(args.width))
    augment_gen = torch.Generator().manual_seed(args.seed * 1000 + rank)

    peak_lr = args.base_lr * world_size ** 0.45
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, weight_decay=args.weight_decay)
    steps_per_epoch = len(train_loader)
    if args.limit_train_batches is not None:
        steps_per_epoch = max(1, min(steps_per_epoch, args.limit_train_batches))
    total_steps = args.epochs * steps_per_epoch
    warmup_steps = max(1, round(args.warmup_epochs * steps_per_epoch))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, warmup_steps, total_steps))

    if is_main:
        n_params = sum(p.numel() for p in model.parameters())
        print(f"backend={args.backend} world_size={world_size} params={n_params:,} "
              f"train={len(train_set)} test={len(test_set)} global_batch="
              f"{args.batch_size * world_size} lr={args.base_lr:g}*{world_size}^0.45="
              f"{peak_lr:.3e} (warm-up {warmup_steps} steps, cosine over {total_steps})")
        print(f"{'epoch':>5} {'train_loss':>10} {'val_loss':>9} {'val_acc':>8} {'samples/s':>10}")

    val_acc = 0.0
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        with tqdm(total=steps_per_epoch, desc=f"epoch {epoch}/{args.epochs}", leave=False,
                  disable=not (is_main and args.progress), dynamic_ncols=True) as progress:
            start = time.perf_counter()
            train_loss = train_epoch(model, train_loader, optimizer, scheduler, fill,
                                     augment_gen, progress, steps_per_epoch)
            elapsed = time.perf_counter() - start
        samples = min(len(train_sampler), steps_per_epoch * args.batch_size)
        samples_per_s = samples * world_size / elapsed
        val_loss, val_acc = evaluate(model, test_loader)
        if is_main:
            print(f"{epoch:>5} {train_loss:>10.4f} {val_loss:>9.4f} {val_acc:>8.2%} "
                  f"{samples_per_s:>10.0f}", flush=True)

    # Every rank sees the same gathered parameters and all-reduced accuracy, so all reach the same
    # verdict; rank 0 reports it.
    bad_ranks = differing_ranks(model, world_size)
    failures: list[str] = []
    if bad_ranks:
        failures.append(f"parameters differ from rank 0 on ranks {bad_ranks}")
    elif is_main:
        print(f"parameters bitwise equal on all {world_size} ranks")
    if is_main:
        print(f"final validation accuracy {val_acc:.2%} (target {args.target_acc:.2%})")
    if val_acc < args.target_acc:
        failures.append(f"validation accuracy {val_acc:.2%} is below target {args.target_acc:.2%}")
    dist.destroy_process_group()
    if failures:
        raise SystemExit(f"FAILED: {'; '.join(failures)}" if is_main else 1)


if __name__ == "__main__":
    main()
