"""Which device an mccl worker drives, shared by :mod:`mccl.lightning` and :mod:`mccl.ray`.

mccl runs one process per device. A Mac has exactly one MPS device, so a Mac runs exactly one
worker; a CUDA host runs one worker per GPU; any other host runs CPU workers.
"""
from __future__ import annotations

from typing import Sequence, Union

import torch

from . import DEVICES

_DevicesArg = Union[int, str, Sequence[int], None]


class OneMPSDevicePerHostError(ValueError):
    """Raised when a worker asks for more than the single MPS device a Mac has."""


def host_device_type() -> str:
    """The best device type this host offers: ``"mps"``, else ``"cuda"``, else ``"cpu"``.

    This is the hardware's answer, not the backend's: a device type that this build of mccl cannot
    carry yet is reported by :func:`check_backend_carries` with a clear error instead of being
    replaced by the CPU behind the user's back.
    """
    if torch.backends.mps.is_available():
        return "mps"
    if torch.cuda.is_available():
        return "cuda"
    return "cpu"


def check_backend_carries(device: torch.device) -> None:
    """Raise ``RuntimeError`` if the ``"mccl"`` backend of this build does not accept tensors on
    ``device``.

    The check happens before the process group exists, so the user sees one sentence naming the
    device and the way out, rather than c10d's "no backend type associated with device type"
    from inside the first gradient bucket.
    """
    if device.type not in DEVICES:
        raise RuntimeError(
            f"this build of mccl carries tensors on {DEVICES} only, but the worker's device is "
            f"{device}: train on the CPU (accelerator='cpu' in Lightning, device='cpu' in a Ray "
            f"loop) until mccl's {device.type} support is installed")


def parse_mps_devices(devices: _DevicesArg) -> list[int]:
    """Normalise Lightning's ``devices`` argument for the MPS device; return ``[0]``.

    Accepts every spelling of "one device": ``1``, ``-1``, ``"1"``, ``"-1"``, ``"auto"``, ``[0]``,
    ``"0,"``. Raises :class:`OneMPSDevicePerHostError` for anything asking for two or more devices
    or for an index other than 0 (Lightning's own parser lets ``devices=2`` through under torchrun,
    where it assumes one visible GPU per process).
    """
    ids: list[int]
    if devices is None or devices == "auto":
        ids = [0]
    elif isinstance(devices, str):
        text = devices.strip()
        if "," in text:
            ids = [int(x) for x in text.split(",") if x.strip()]
        else:
            return parse_mps_devices(int(text))
    elif isinstance(devices, int):
        if devices in (-1, 1):
            ids = [0]
        elif devices > 1:
            ids = list(range(devices))
        else:
            raise OneMPSDevicePerHostError(f"devices={devices!r} is not a device count")
    else:
        ids = [int(d) for d in devices]
    if ids != [0]:
        raise OneMPSDevicePerHostError(
            f"devices={devices!r} asks for MPS devices {ids}, but a Mac has exactly one MPS device "
            "(mps:0) and mccl runs one process per device: use devices=1 and num_nodes=<number of "
            "Macs> in Lightning, or one Ray worker per Mac with mccl.ray")
    return ids
