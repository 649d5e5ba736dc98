"""PyTorch Lightning integration: DDP over mccl on Macs (MPS), CUDA hosts and CPUs.

Importing this module registers two names with Lightning's registries::

    import mccl.lightning  # registers strategy "ddp_mccl" and accelerator "mccl"
    trainer = lightning.Trainer(strategy="ddp_mccl", accelerator="mccl", devices=1, num_nodes=4)

* Strategy ``"ddp_mccl"`` (:class:`MCCLDDPStrategy`; also ``"ddp_mccl_spawn"`` and
  ``"ddp_mccl_fork"``): Lightning's DDP with ``process_group_backend="mccl"``, ``device_ids=None``
  and comm hooks on every device type.
* Accelerator ``"mccl"`` (:class:`MCCLAccelerator`): this host's own device, ``mps`` on a Mac,
  else ``cuda``, else ``cpu``; one process per device, so a Mac takes ``devices=1``.

Why an accelerator of its own: Lightning refuses every DDP-family strategy when MPS is available
and ``accelerator`` is ``"mps"``, ``"gpu"`` or ``"auto"`` (its guard looks at the arguments
before any strategy code runs). An accelerator that is not Lightning's ``MPSAccelerator`` is the
supported way past that guard; nothing in Lightning is patched. ``accelerator="cpu"`` and
``accelerator="cuda"`` work with ``"ddp_mccl"`` as they are. See ``docs/INTEGRATIONS.md``.
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from lightning.fabric.utilities.distributed import _init_dist_connection
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators import Accelerator, AcceleratorRegistry, CPUAccelerator, CUDAAccelerator
from lightning.pytorch.accelerators.mps import MPSAccelerator
from lightning.pytorch.overrides.distributed import _register_ddp_comm_hook
from lightning.pytorch.plugins.precision import MixedPrecision
from lightning.pytorch.strategies import DDPStrategy, StrategyRegistry
from torch.nn.parallel import DistributedDataParallel

from . import BACKEND_NAME
from ._device import OneMPSDevicePerHostError, check_backend_carries, host_device_type, parse_mps_devices

__all__ = ["ACCELERATOR_NAME", "STRATEGY_NAME", "MCCLAccelerator", "MCCLDDPStrategy", "OneMPSDevicePerHostError"]

log = logging.getLogger(__name__)

STRATEGY_NAME = "ddp_mccl"
ACCELERATOR_NAME = "mccl"

_CONCRETE = {"mps": MPSAccelerator, "cuda": CUDAAccelerator, "cpu": CPUAccelerator}


class MCCLAccelerator(Accelerator):
    """This host's device for a DDP-over-mccl job: ``mps`` if present, else ``cuda``, else ``cpu``.

    Registered as ``accelerator="mccl"``. Lightning calls the device-parsing methods on the class,
    so the choice depends on the host only, never on constructor arguments; to force a device
    type use Lightning's own ``accelerator="cpu"`` or ``"cuda"``.

    ``devices`` follows the chosen type: on a Mac only one device exists, and any request for more
    (``devices=2``, ``[0, 1]``, ``"0,1"``) raises :class:`~mccl._device.OneMPSDevicePerHostError`
    (a ``ValueError``); on CUDA hosts it means GPUs, on CPU hosts processes, as in Lightning.
    Per-device setup, statistics and teardown are Lightning's own accelerator's for that type.
    """

    @staticmethod
    def device_type() -> str:
        """The device type this host resolves to (``"mps"``, ``"cuda"`` or ``"cpu"``)."""
        return host_device_type()

    @classmethod
    def _concrete(cls) -> type[Accelerator]:
        return _CONCRETE[cls.device_type()]

    def setup_device(self, device: torch.device) -> None:
        """Check ``device`` has this host's type and pin the process to it (``cuda.set_device``)."""
        self._concrete()().setup_device(device)

    def get_device_stats(self, device: Union[str, torch.device]) -> dict[str, Any]:
        return self._concrete()().get_device_stats(device)

    def teardown(self) -> None:
        self._concrete()().teardown()

    @classmethod
    def parse_devices(cls, devices: Any) -> Any:
        """Lightning's parsing for this host's device type, except that on MPS anything but one
        device raises :class:`~mccl._device.OneMPSDevicePerHostError`."""
        if cls.device_type() == "mps":
            return parse_mps_devices(devices)
        return cls._concrete().parse_devices(devices)

    @classmethod
    def get_parallel_devices(cls, devices: Any) -> list[torch.device]:
        if cls.device_type() == "mps":
            return [torch.device("mps", i) for i in parse_mps_devices(devices)]
        return cls._concrete().get_parallel_devices(devices)

    @classmethod
    def auto_device_count(cls) -> int:
        return cls._concrete().auto_device_count()

    @staticmethod
    def is_available() -> bool:
        return True  # every host has at least its CPU

    @staticmethod
    def name() -> str:
        return ACCELERATOR_NAME

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register(cls.name(), cls, description=cls.__doc__.splitlines()[0])


class MCCLDDPStrategy(DDPStrategy):
    """Lightning's ``DDPStrategy`` with every collective carried by the ``"mccl"`` backend.

    Registered as ``strategy="ddp_mccl"`` (subprocess launcher, like ``"ddp"``),
    ``"ddp_mccl_spawn"`` and ``"ddp_mccl_fork"``. Differences from ``DDPStrategy``:

    * ``process_group_backend`` is ``"mccl"``; the process group is created without
      ``device_id`` (binding a group to a device is an NCCL notion), and DDP gets
      ``device_ids=None`` on every device type.
    * Before the group exists it checks that this build of mccl carries the worker's device
      (``RuntimeError`` naming the device otherwise) and, when the group already exists
      (Ray Train creates it before the training function runs), that its backend is mccl.
    * ``ddp_comm_hook`` / ``ddp_comm_state`` are registered on every device type, not only CUDA.
    * A ``MixedPrecision`` plugin that Lightning built for the wrong device type (Lightning picks
      ``"cuda"`` for any accelerator it does not know) is rebuilt for the root device's type.

    Args:
        process_group_backend: must be ``"mccl"`` (the default); anything else raises
            ``ValueError``, since another backend is what plain ``DDPStrategy`` is for.
        **kwargs: everything ``DDPStrategy`` accepts (``accelerator``, ``parallel_devices``,
            ``cluster_environment``, ``timeout``, ``start_method``, ``ddp_comm_hook``, and
            ``DistributedDataParallel`` keywords such as ``find_unused_parameters``).
    """

    strategy_name = STRATEGY_NAME

    def __init__(self, *args: Any, process_group_backend: Optional[str] = BACKEND_NAME, **kwargs: Any) -> None:
        if process_group_backend not in (None, BACKEND_NAME):
            raise ValueError(f"{type(self).__name__} runs on the {BACKEND_NAME!r} backend, got "
                             f"process_group_backend={process_group_backend!r}; use DDPStrategy for others")
        super().__init__(*args, process_group_backend=BACKEND_NAME, **kwargs)

    def setup_environment(self) -> None:
        check_backend_carries(self.root_device)
        self._match_precision_to_device()
        super().setup_environment()  # accelerator.setup_device(root_device), then setup_distributed

    def setup_distributed(self) -> None:
        # DDPStrategy.setup_distributed passes device_id=root_device for non-CPU devices, which
        # binds the group to that device; mccl groups stay unbound.
        log.debug("%s: setting up distributed...", type(self).__name__)
        reset_seed()
        self.set_world_ranks()
        if dist.is_available() and dist.is_initialized():
            backend = dist.get_backend()
            if backend != BACKEND_NAME:
                raise RuntimeError(
                    f"the default process group already exists with backend {backend!r}, but "
                    f"{type(self).__name__} needs {BACKEND_NAME!r}: under Ray Train run the job with "
                    "mccl.ray.MCCLTrainer (or torch_config=mccl.ray.MCCLConfig()), elsewhere let "
                    "the strategy create the group")
        assert self.cluster_environment is not None
        _init_dist_connection(self.cluster_environment, BACKEND_NAME, timeout=self._timeout)

    def _get_process_group_backend(self) -> str:
        return BACKEND_NAME

    def determine_ddp_device_ids(self) -> Optional[list[int]]:
        return None

    def _register_ddp_hooks(self) -> None:
        if self._ddp_comm_hook is None and self._ddp_comm_wrapper is None:
            return
        assert isinstance(self.model, DistributedDataParallel)
        _register_ddp_comm_hook(model=self.model, ddp_comm_state=self._ddp_comm_state,
                                ddp_comm_hook=self._ddp_comm_hook, ddp_comm_wrapper=self._ddp_comm_wrapper)

    def _match_precision_to_device(self) -> None:
        plugin = self.precision_plugin
        device_type = self.root_device.type
        if isinstance(plugin, MixedPrecision) and plugin.device != device_type:
            log.debug("rebuilding %s for device type %s (was %s)", plugin.precision, device_type, plugin.device)
            self.precision_plugin = MixedPrecision(plugin.precision, device_type)

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        for name, start_method in ((STRATEGY_NAME, "popen"), (f"{STRATEGY_NAME}_spawn", "spawn"),
                                   (f"{STRATEGY_NAME}_fork", "fork")):
            if name not in strategy_registry:
                strategy_registry.register(name, cls, description=f"DDP over mccl with start_method {start_method!r}",
                                           start_method=start_method)


if ACCELERATOR_NAME not in AcceleratorRegistry:
    MCCLAccelerator.register_accelerators(AcceleratorRegistry)
MCCLDDPStrategy.register_strategies(StrategyRegistry)
