"""The main job (examples/train.py) as a LightningModule and a LightningDataModule.

This is the one place the Lightning version of the job lives; ``lightning_train.py`` (Lightning's
own launcher or torchrun) and ``ray_train.py`` (Lightning inside Ray Train) both train exactly
this module. The network, data split, augmentation and learning-rate rule are train.py's: a
GroupNorm ResNet on scikit-learn's 8x8 digits, AdamW at ``base_lr * K**0.45`` for K ranks with a
linear warm-up and cosine decay, random one-pixel shifts.

Validation is exact: every rank scores a strided, unpadded shard of the test split, and the loss
and accuracy are torchmetrics states summed over ranks (no sample counted twice, none dropped).
"""
from __future__ import annotations

import logging
import math
import time
import warnings
from typing import Any, Iterator

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics
from torch.utils.data import DataLoader, DistributedSampler

from train import GroupNormResNet, differing_ranks, load_data, lr_factor, random_shift

#: train.py's per-epoch table: the header, and one row per epoch.
EPOCH_HEADER = f"{'epoch':>5} {'train_loss':>10} {'val_loss':>9} {'val_acc':>8} {'samples/s':>10}"


def quiet_lightning() -> None:
    """Keep Lightning to warnings and errors: no banner about GPUs, TPUs, tips and the process
    group, and no deprecation warning from Lightning's own code under this torch (one per rank,
    nothing a user can act on). The per-epoch lines come from :class:`EpochTable` instead."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")


class EpochTable(L.Callback):
    """Prints train.py's table on global rank 0: after every epoch's validation, the epoch's
    training loss (averaged over ranks), validation loss and accuracy (exact, summed over ranks)
    and global training samples/s (this rank's samples times the world size, over the time from
    the epoch's first batch to its last). Lines go through the progress bar when there is one, so
    they do not break it."""

    def __init__(self) -> None:
        self._start = 0.0
        self._elapsed = 0.0
        self._samples = 0

    def _print(self, trainer: L.Trainer, line: str) -> None:
        bar = trainer.progress_bar_callback
        if bar is not None and hasattr(bar, "print"):
            bar.print(line)
        else:
            print(line, flush=True)

    def on_fit_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self._print(trainer, EPOCH_HEADER)

    def on_train_epoch_start(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        self._start, self._elapsed, self._samples = time.perf_counter(), 0.0, 0

    def on_train_batch_end(self, trainer: L.Trainer, module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        self._samples += len(batch[1])
        self._elapsed = time.perf_counter() - self._start

    def on_train_epoch_end(self, trainer: L.Trainer, module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        metrics = trainer.callback_metrics
        value = lambda key: float(metrics[key]) if key in metrics else float("nan")  # noqa: E731
        rate = self._samples * trainer.world_size / self._elapsed if self._elapsed > 0 else float("nan")
        self._print(trainer, f"{trainer.current_epoch + 1:>5} {value('train_loss_epoch'):>10.4f} "
                             f"{value('val_loss'):>9.4f} {value('val_acc'):>8.2%} {rate:>10.0f}")

__all__ = ["DigitsDataModule", "DigitsModule", "EpochTable", "check_parameters_equal", "quiet_lightning"]


class UnpaddedShardSampler(DistributedSampler):
    """Indices ``rank, rank + world, ...`` of the dataset: each sample on exactly one rank.

    A ``DistributedSampler`` subclass, so Lightning leaves it in place instead of injecting its
    own padded one.
    """

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, len(self.dataset), self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, len(self.dataset), self.num_replicas))


class DigitsDataModule(L.LightningDataModule):
    """sklearn digits, train.py's fixed stratified 80/20 split; the training set is sharded by
    Lightning's distributed sampler, the test split by :class:`UnpaddedShardSampler`."""

    def __init__(self, batch_size: int = 32) -> None:
        super().__init__()
        self.batch_size = batch_size

    def setup(self, stage: str) -> None:
        self.train_set, self.test_set, self.background = load_data()

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        world = self.trainer.world_size if self.trainer else 1
        rank = self.trainer.global_rank if self.trainer else 0
        sampler = UnpaddedShardSampler(self.test_set, num_replicas=world, rank=rank, shuffle=False)
        return DataLoader(self.test_set, batch_size=256, sampler=sampler)


class DigitsModule(L.LightningModule):
    """train.py's GroupNorm ResNet and recipe as a LightningModule.

    Logs ``train_loss`` (per step and per epoch, averaged over ranks with ``sync_dist=True``) and
    ``val_loss``/``val_acc`` (torchmetrics, synchronised across ranks when computed).
    """

    def __init__(self, width: float = 1.0, base_lr: float = 4e-4, weight_decay: float = 0.05,
                 warmup_epochs: float = 1.0, seed: int = 0, background: float | None = None) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = GroupNormResNet(width)
        self.val_loss = torchmetrics.MeanMetric()
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=10, average="micro")
        self._augment: torch.Generator | None = None
        self._background = background

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def on_fit_start(self) -> None:
        # A different, fixed augmentation stream on every rank, as in train.py.
        self._augment = torch.Generator().manual_seed(self.hparams.seed * 1000 + self.global_rank)
        if self._background is None:
            self._background = self.trainer.datamodule.background

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        x = random_shift(x.cpu(), self._background, self._augment).to(self.device)
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=True, prog_bar=True,
                 batch_size=len(y))
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.val_loss.update(F.cross_entropy(logits, y, reduction="none"))
        self.val_acc.update(logits, y)
        self.log("val_loss", self.val_loss, on_epoch=True, prog_bar=True)
        self.log("val_acc", self.val_acc, on_epoch=True, prog_bar=True)

    def configure_optimizers(self) -> Any:
        world = self.trainer.world_size
        peak_lr = self.hparams.base_lr * world ** 0.45
        optimizer = torch.optim.AdamW(self.parameters(), lr=peak_lr, weight_decay=self.hparams.weight_decay)
        total = int(self.trainer.estimated_stepping_batches)
        epochs = self.trainer.max_epochs if self.trainer.max_epochs and self.trainer.max_epochs > 0 else 1
        warmup = max(1, round(self.hparams.warmup_epochs * total / epochs)) if math.isfinite(total) else 1
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, warmup, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def check_parameters_equal(module: L.LightningModule, world_size: int) -> list[int]:
    """The ranks whose parameter bits differ from rank 0's (all-gathered, as train.py does)."""
    return differing_ranks(module.model, world_size) if world_size > 1 else []
