"""Lightning inside Ray Train on mccl: the strategy that ``ray.train.lightning.prepare_trainer`` accepts.

Ray's ``prepare_trainer`` accepts only its own strategies (``RayDDPStrategy`` and friends), whose
device is Ray's ``get_device()``: the CPU on a Mac. :class:`RayMCCLStrategy` is both a
``RayDDPStrategy`` and an :class:`~mccl.lightning.MCCLDDPStrategy`::

    import lightning as L
    from ray.train.lightning import RayLightningEnvironment, RayTrainReportCallback, prepare_trainer
    from mccl.ray.lightning import RayMCCLStrategy

    def train_loop(config):  # run by mccl.ray.MCCLTrainer
        trainer = L.Trainer(accelerator="mccl", devices=1, strategy=RayMCCLStrategy(),
                            plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()])
        trainer = prepare_trainer(trainer)
        trainer.fit(model, datamodule=data)

``accelerator="mccl"`` resolves to the machine's device (``mps`` on a Mac); ``"cpu"`` and
``"cuda"`` work too. Lightning's ``"auto"``/``"mps"``/``"gpu"`` would meet Lightning's
DDP-on-MPS guard on a Mac.
"""
from __future__ import annotations

import torch
from ray.train.lightning import RayDDPStrategy

from ..lightning import MCCLDDPStrategy
from . import get_device

__all__ = ["RayMCCLStrategy"]


class RayMCCLStrategy(MCCLDDPStrategy, RayDDPStrategy):
    """DDP over mccl for Lightning under Ray Train (a ``RayDDPStrategy``, so ``prepare_trainer``
    takes it).

    Ray Train created the process group before the training function started; this strategy
    checks that it is mccl's (``RuntimeError`` otherwise, e.g. under a plain ``TorchTrainer``
    with gloo) and uses it. Ranks and world size come from ``RayLightningEnvironment``; the
    device is one per worker: ``mps:0`` on a Mac, Ray's assigned GPU on CUDA hosts, or the CPU,
    following the accelerator. Takes the same arguments as :class:`~mccl.lightning.MCCLDDPStrategy`.
    """

    @property
    def root_device(self) -> torch.device:
        kind = self.parallel_devices[0].type if self.parallel_devices else get_device().type
        if kind == "cpu":
            return torch.device("cpu")
        if kind == "mps":
            return torch.device("mps", 0)
        return get_device()
