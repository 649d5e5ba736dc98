"""Ray Train integration: TorchTrainer jobs whose process group is mccl, one worker per machine.

A fleet of Macs is invisible to a GPU-shaped Ray job: Ray counts no GPU on a Mac (or, in newer
Ray, exactly one, which a second GPU worker then waits for forever). mccl schedules on a custom
resource instead. Every machine joins the cluster with one unit of it (``mccl-ray-node`` does
this), every worker asks for one unit, so each machine runs exactly one worker, on its own device::

    from mccl.ray import MCCLTrainer, scaling_config

    trainer = MCCLTrainer(train_loop, scaling_config=scaling_config(num_workers=4))
    result = trainer.fit()

Inside ``train_loop`` the default process group already exists with backend ``"mccl"``; use
:func:`get_device` for this worker's device (``mps`` on a Mac; Ray's own ``get_device`` says
``cpu`` there), and :class:`mccl.ray.lightning.RayMCCLStrategy` for Lightning under
``ray.train.lightning.prepare_trainer``.

Requires Ray Train v2 (the default since Ray 2.5x; ``RAY_TRAIN_V2_ENABLED=1``).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Union

import ray
import torch
from ray.train import ControllerError, FailureConfig, RunConfig, ScalingConfig, UserCallback
from ray.train.torch import TorchConfig, TorchTrainer
from ray.train.torch.config import _TorchBackend
from ray.train.v2._internal.constants import WORKER_GROUP_START_TIMEOUT_S_ENV_VAR
from ray.train.v2._internal.exceptions import WorkerGroupStartupTimeoutError

from .. import BACKEND_NAME
from .._device import host_device_type

__all__ = [
    "DEFAULT_RESOURCE", "DEFAULT_PLACEMENT_TIMEOUT_S", "DEFAULT_ELASTIC_PLACEMENT_TIMEOUT_S",
    "DEFAULT_ELASTIC_PLACEMENT_RETRIES", "DEFAULT_RESIZE_INTERVAL_S", "InsufficientMachinesError", "MCCLConfig",
    "MCCLTrainer", "PlacementTimeoutError", "check_capacity", "get_device", "resources_per_worker",
    "scaling_config",
]

log = logging.getLogger(__name__)

#: The custom resource every mccl machine advertises (one unit each) and every worker requests.
DEFAULT_RESOURCE = "pool:mac"
#: How long the workers may wait for their placement group before the job fails, in seconds.
DEFAULT_PLACEMENT_TIMEOUT_S = 60.0
#: The same for elastic jobs, whose restart after a loss may ask once for a machine that just left.
DEFAULT_ELASTIC_PLACEMENT_TIMEOUT_S = 30.0
#: Placement timeouts an elastic job survives before it gives up.
DEFAULT_ELASTIC_PLACEMENT_RETRIES = 10
#: How often an elastic job looks for machines that joined, in seconds (Ray's default is 60).
DEFAULT_RESIZE_INTERVAL_S = 60.0
#: Environment variables that belong to NCCL or to PyTorch's NCCL group, removed from every worker.
NCCL_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_")


class InsufficientMachinesError(ValueError):
    """The live cluster cannot hold the requested workers, whatever else is running on it."""


class PlacementTimeoutError(RuntimeError):
    """The workers' placement group was not ready within the placement timeout."""


def get_device() -> torch.device:
    """This worker's device: ``mps:0`` on a Mac, the GPU Ray assigned on a CUDA host, else CPU.

    Ray's own ``ray.train.torch.get_device()`` reports ``cpu`` on a Mac (its GPU resource is the
    only thing it looks at) and ``cuda`` where a Mac advertises ``GPU: 1``; this one looks at the
    hardware. For a plain loop: ``ray.train.torch.prepare_model(model, move_to_device=get_device())``.
    """
    kind = host_device_type()
    if kind == "mps":
        return torch.device("mps", 0)
    if kind == "cuda":
        import ray.train.torch

        return ray.train.torch.get_device()
    return torch.device("cpu")


def resources_per_worker(config: ScalingConfig) -> dict[str, float]:
    """Everything one worker of ``config`` reserves (CPU, GPU and custom resources), without zeros."""
    need = dict(config.additional_resources_per_worker)
    need["CPU"] = config.num_cpus_per_worker
    need["GPU"] = config.num_gpus_per_worker
    return {k: float(v) for k, v in need.items() if v}


def scaling_config(num_workers: Union[int, tuple[int, int]], *, resource: str = DEFAULT_RESOURCE,
                   cpus_per_worker: float = 1, use_gpu: bool = False, placement_strategy: str = "SPREAD",
                   extra_resources: Optional[dict[str, float]] = None,
                   resize_interval_s: float = DEFAULT_RESIZE_INTERVAL_S) -> ScalingConfig:
    """A Ray Train ``ScalingConfig`` for an mccl job: one unit of ``resource`` per worker.

    Args:
        num_workers: number of workers (= machines, since each machine holds one unit), or a
            ``(min, max)`` range for an elastic job: it starts with as many machines as hold the
            resource (at least ``min``), restarts from its latest checkpoint with the machines
            that remain when one leaves, and grows (again from the latest checkpoint) when more
            arrive, up to ``max``. See :class:`MCCLTrainer` and docs/FLEET.md.
        resize_interval_s: elastic jobs only: how often a running job looks for machines that
            joined (Ray's ``elastic_resize_monitor_interval_s``). Each resize is a restart from
            the latest checkpoint, so this also bounds how often the job pays for one.
        resource: the custom resource the machines advertise (``mccl-ray-node --resource``).
        cpus_per_worker: CPUs each worker reserves; data loading runs inside this budget.
        use_gpu: reserve Ray's ``GPU`` resource too. Not needed on Macs: the MPS device is found
            by :func:`get_device` whether or not Ray counts it, and Rays without Apple-GPU
            detection have no ``GPU`` to give.
        placement_strategy: ``"SPREAD"`` (default) or ``"STRICT_SPREAD"``.
        extra_resources: further custom resources per worker.

    Raises:
        ValueError: ``num_workers < 1``, a range that is not ``1 <= min <= max``, or another
            placement strategy.
    """
    if isinstance(num_workers, (tuple, list)) and len(num_workers) == 2 and all(
            isinstance(n, int) and not isinstance(n, bool) for n in num_workers):
        num_workers = tuple(num_workers)
        if not 1 <= num_workers[0] <= num_workers[1]:
            raise ValueError(f"an elastic num_workers range must be (min, max) with 1 <= min <= max, got {num_workers!r}")
    elif not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 1:
        raise ValueError(f"num_workers must be a positive int or a (min, max) range, got {num_workers!r}")
    if placement_strategy not in ("SPREAD", "STRICT_SPREAD"):
        raise ValueError(f"mccl places one worker per machine: placement_strategy must be SPREAD or "
                         f"STRICT_SPREAD, got {placement_strategy!r}")
    resources = {"CPU": cpus_per_worker, resource: 1, **(extra_resources or {})}
    extra = {"elastic_resize_monitor_interval_s": float(resize_interval_s)} if isinstance(num_workers, tuple) else {}
    return ScalingConfig(num_workers=num_workers, use_gpu=use_gpu, resources_per_worker=resources,
                         placement_strategy=placement_strategy, **extra)


def check_capacity(config: ScalingConfig, resource: str = DEFAULT_RESOURCE) -> dict[str, int]:
    """Check that the live cluster's nodes can hold ``config``'s workers at all; return how many
    workers fit on each node (by node IP, nodes that fit none left out).

    This looks at the nodes' total resources, so it is independent of other jobs: it catches a
    worker count larger than the machines holding ``resource``, a machine set up without it, or a
    ``GPU`` request on Macs whose Ray does not count their GPU. Resources that exist but are held
    by another job are the placement timeout's business (:class:`MCCLTrainer`).

    Raises:
        InsufficientMachinesError: with the per-node arithmetic and what to do about it.
        RuntimeError: Ray is not initialised.
    """
    if not ray.is_initialized():
        raise RuntimeError("call ray.init() (or ray.init(address=...)) before checking capacity")
    need = resources_per_worker(config)
    wanted = config.min_workers
    strict = config.placement_strategy == "STRICT_SPREAD"
    fits: dict[str, int] = {}
    lacking: dict[str, list[str]] = {}
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        have = node.get("Resources", {})
        short = [k for k, v in need.items() if have.get(k, 0.0) + 1e-9 < v]
        name = node.get("NodeManagerAddress", "?")
        if short:
            for k in short:
                lacking.setdefault(k, []).append(name)
            continue
        n = min(math.floor(have[k] / v + 1e-9) for k, v in need.items())
        fits[name] = fits.get(name, 0) + (min(n, 1) if strict else n)
    total = sum(fits.values())
    if total < wanted:
        parts = [f"{wanted} worker(s) need {need} each, but the live cluster can hold {total}"]
        if fits:
            parts.append("fitting: " + ", ".join(f"{ip} x{n}" for ip, n in sorted(fits.items())))
        for k, ips in sorted(lacking.items()):
            parts.append(f"{len(ips)} node(s) without enough {k!r} ({', '.join(sorted(ips))})")
        if resource in need:
            parts.append(f"each machine holds one unit of {resource!r}, so this is one worker per machine: "
                         f"start `mccl-ray-node --address <head>` on more machines or lower num_workers")
        if "GPU" in need:
            parts.append("Ray may not count a Mac's GPU (older Ray) and counts at most one: mccl finds the "
                         "MPS device without Ray's GPU resource, so use_gpu=False is enough")
        raise InsufficientMachinesError("; ".join(parts))
    return fits


def _prepare_worker() -> dict[str, Any]:
    """Runs on every worker before the process group exists: register mccl, drop NCCL settings."""
    import mccl  # noqa: F401  (registers the backend in this worker process)

    dropped = sorted(k for k in os.environ if k.startswith(NCCL_ENV_PREFIXES))
    for key in dropped:
        del os.environ[key]
    return {"host": socket.gethostname(), "pid": os.getpid(), "device": host_device_type(), "dropped": dropped}


class _MCCLBackend(_TorchBackend):
    """Ray's torch backend, preceded by :func:`_prepare_worker` on every worker."""

    def on_start(self, worker_group: Any, backend_config: "MCCLConfig") -> None:
        infos = worker_group.execute(_prepare_worker)
        for rank, info in enumerate(infos):
            log.info("mccl worker %d: host %s pid %d device %s%s", rank, info["host"], info["pid"], info["device"],
                     f", dropped {info['dropped']}" if info["dropped"] else "")
        super().on_start(worker_group, backend_config)


@dataclass
class MCCLConfig(TorchConfig):
    """``TorchConfig`` whose process group is mccl's.

    Before ``init_process_group`` every worker imports mccl (registering the backend in that
    process) and loses its ``NCCL_*``/``TORCH_NCCL_*`` environment variables, which a GPU
    cluster's runtime environment or Ray's NCCL defaults may have put there; mccl reads only
    ``MCCL_*``. ``init_method`` and ``timeout_s`` (the group's collective timeout) are Ray's.

    Raises:
        ValueError: ``backend`` is anything but ``"mccl"``.
    """

    backend: Optional[str] = BACKEND_NAME

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = BACKEND_NAME
        if self.backend != BACKEND_NAME:
            raise ValueError(f"MCCLConfig runs the {BACKEND_NAME!r} backend, got backend={self.backend!r}")

    @property
    def backend_cls(self) -> type:
        return _MCCLBackend


def _normalise_scaling(config: ScalingConfig, resource: str) -> ScalingConfig:
    if config.elasticity_enabled and config.min_workers < 1:
        raise ValueError(f"an elastic mccl job needs at least one worker: num_workers={config.num_workers!r}")
    extra = dict(config.resources_per_worker or {})
    if config.resources_per_worker is None and not config.use_gpu:
        extra["CPU"] = 1  # Ray's default for a worker without resources_per_worker
    if extra.get(resource, 1) != 1:
        raise ValueError(f"each mccl worker takes exactly one unit of {resource!r} (one machine); got "
                         f"{extra[resource]!r}")
    extra[resource] = 1
    strategy = config.placement_strategy
    if strategy not in ("SPREAD", "STRICT_SPREAD"):
        log.info("mccl places one worker per machine: placement_strategy %s -> SPREAD", strategy)
        strategy = "SPREAD"
    return dataclasses.replace(config, resources_per_worker=extra, placement_strategy=strategy)


@contextmanager
def _env(key: str, value: str) -> Iterator[None]:
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


_REFRESH_REQUESTER = "mccl-elastic-refresh"


def _refresh_machines(timeout_s: float = 10.0) -> bool:
    """Make Ray Train's picture of the machines current; False if this Ray cannot.

    Ray Train 2.60 sizes an elastic worker group from Ray Data's ``AutoscalingCoordinator``, whose
    picture of the alive nodes is refreshed every 20 s. Right after a Mac died the job would ask
    for the old number of workers, wait out the placement timeout, and only then restart with the
    machines that remain; a Mac that joined would wait up to 20 s more to be used. This asks the
    coordinator to recompute its picture now (``get_reserved_resources(..., recompute=True)``,
    the call Ray's own code makes before it pins work to nodes). The actor is Ray-internal: on a
    Ray without it this returns False and the job runs at Ray's own pace.
    """
    try:
        from ray.data._internal.cluster_autoscaler.default_autoscaling_coordinator import (
            get_or_create_autoscaling_coordinator)
    except ImportError:
        return False
    try:
        coordinator = get_or_create_autoscaling_coordinator()
        ray.get(coordinator.get_reserved_resources.remote(_REFRESH_REQUESTER, recompute=True), timeout=timeout_s)
    except Exception as exc:  # a busy or restarting actor: the next refresh may do
        log.debug("mccl: refreshing Ray's view of the machines failed: %s", exc)
        return False
    return True


class _RefreshOnWorkerLoss(UserCallback):
    """Runs in Ray Train's controller: when workers fail (a Mac left, so its worker died and the
    others' mccl calls failed), refresh the picture of the machines before the controller sizes
    the next worker group from it (see :func:`_refresh_machines`)."""

    def after_exception(self, run_context: Any, worker_exceptions: dict) -> None:
        _refresh_machines(timeout_s=5.0)


class _ResourceRefresher:
    """In the driver, for elastic jobs: :func:`_refresh_machines` every ``interval_s`` while the
    job runs, so machines that joined are seen within that time instead of Ray's 20 s."""

    def __init__(self, interval_s: float) -> None:
        import threading

        self.interval_s = float(interval_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mccl-resource-refresh", daemon=True)

    def __enter__(self) -> "_ResourceRefresher":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                from ray.data._internal.cluster_autoscaler import default_autoscaling_coordinator  # noqa: F401
            except ImportError:
                log.info("mccl: no AutoscalingCoordinator in this Ray: elastic jobs see new machines at Ray's pace")
                return
            _refresh_machines()


class MCCLTrainer(TorchTrainer):
    """Ray Train's ``TorchTrainer`` for mccl: backend ``"mccl"``, one worker per machine, and a
    clear error instead of a job that stays PENDING.

    Args:
        train_loop_per_worker: as for ``TorchTrainer``; it runs with the mccl group initialised.
        scaling_config: a ``ray.train.ScalingConfig`` (see :func:`scaling_config`). If its
            ``resources_per_worker`` lacks ``resource``, one unit is added; the placement strategy
            becomes ``SPREAD`` unless it is ``STRICT_SPREAD``. Required.
        torch_config: an :class:`MCCLConfig` (the default); a plain ``TorchConfig`` is accepted
            only with ``backend`` None or ``"mccl"`` and keeps its ``init_method``/``timeout_s``.
        run_config: as for ``TorchTrainer``. Its ``FailureConfig.controller_failure_limit`` is
            replaced by ``placement_retries``: Ray's default (-1) retries an unplaceable worker
            group forever.
        resource: the custom resource each machine advertises one unit of.
        placement_timeout_s: how long the placement group may stay unready before the attempt
            fails (sets ``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S`` for this ``fit``); default 60 s,
            30 s for elastic jobs.
        placement_retries: how many more times to wait ``placement_timeout_s`` before giving up;
            default 0, 10 for elastic jobs (whose restarts may ask once for a machine that just left).
        resource_refresh_s: elastic jobs only: refresh Ray's picture of the machines this often
            and whenever workers fail (:func:`_refresh_machines`; Ray 2.60 refreshes it every 20
            s); None leaves it to Ray.
        **kwargs: the remaining ``TorchTrainer`` arguments (``train_loop_config``, ``datasets``,
            ``dataset_config``, ...).

    Raises:
        ValueError: from the constructor, for a non-mccl backend, an elastic range below one
            worker, or a per-worker amount of ``resource`` other than 1.

    Elastic jobs (``num_workers=(min, max)``): when a machine leaves (its agent stops the Ray
    node, or it dies), the surviving workers' mccl calls fail within moments (a closed peer
    fails every in-flight collective), Ray Train tears the worker group down and starts a new
    one on the machines that remain, if at least ``min``, and ``ray.train.get_checkpoint()``
    hands the loop its latest checkpoint; the new group is a new mccl communicator (fresh store
    keys), never the dead one's endpoints. Every ``resize_interval_s`` a running job looks for
    machines that joined and restarts onto them the same way, up to ``max``. Each restart counts
    against ``FailureConfig.max_failures`` (a machine that left without draining) or
    ``max_preemption_failures`` (a drained one; unlimited by default), so set ``max_failures``.

    ``fit()`` raises :class:`InsufficientMachinesError` before anything is scheduled when the
    live nodes cannot hold the workers, and :class:`PlacementTimeoutError` when they could but
    the placement group was not ready in time (the resources are held by other jobs, or a node
    left); training failures are Ray's ``TrainingFailedError`` as usual.
    """

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, scaling_config: ScalingConfig,
                 torch_config: Optional[TorchConfig] = None, run_config: Optional[RunConfig] = None,
                 resource: str = DEFAULT_RESOURCE, placement_timeout_s: Optional[float] = None,
                 placement_retries: Optional[int] = None, resource_refresh_s: Optional[float] = 5.0,
                 **kwargs: Any) -> None:
        if scaling_config is None:
            raise ValueError("MCCLTrainer needs a scaling_config, e.g. mccl.ray.scaling_config(num_workers=4)")
        if torch_config is None:
            torch_config = MCCLConfig()
        elif not isinstance(torch_config, MCCLConfig):
            if torch_config.backend not in (None, BACKEND_NAME):
                raise ValueError(f"MCCLTrainer runs the {BACKEND_NAME!r} backend, got torch_config.backend="
                                 f"{torch_config.backend!r}")
            torch_config = MCCLConfig(init_method=torch_config.init_method, timeout_s=torch_config.timeout_s)
        elastic = scaling_config.elasticity_enabled
        if placement_timeout_s is None:
            placement_timeout_s = DEFAULT_ELASTIC_PLACEMENT_TIMEOUT_S if elastic else DEFAULT_PLACEMENT_TIMEOUT_S
        if placement_retries is None:
            placement_retries = DEFAULT_ELASTIC_PLACEMENT_RETRIES if elastic else 0
        if placement_timeout_s <= 0:
            raise ValueError(f"placement_timeout_s must be positive, got {placement_timeout_s!r}")
        run_config = run_config or RunConfig()
        failure = run_config.failure_config or FailureConfig()
        callbacks = list(run_config.callbacks or [])
        if elastic and resource_refresh_s and not any(isinstance(c, _RefreshOnWorkerLoss) for c in callbacks):
            callbacks.append(_RefreshOnWorkerLoss())
        run_config = dataclasses.replace(
            run_config, failure_config=dataclasses.replace(failure, controller_failure_limit=placement_retries),
            callbacks=callbacks)
        self._mccl_resource = resource
        self._placement_timeout_s = float(placement_timeout_s)
        self._resource_refresh_s = resource_refresh_s
        super().__init__(train_loop_per_worker, torch_config=torch_config,
                         scaling_config=_normalise_scaling(scaling_config, resource), run_config=run_config, **kwargs)

    def fit(self) -> Any:
        """Check capacity, then run the job (see the class docstring for the errors)."""
        if not ray.is_initialized():
            ray.init()
        fits = check_capacity(self.scaling_config, self._mccl_resource)
        log.info("mccl: %s worker(s) over nodes %s", self.scaling_config.num_workers, fits)
        refresh = self.scaling_config.elasticity_enabled and self._resource_refresh_s
        try:
            with _env(WORKER_GROUP_START_TIMEOUT_S_ENV_VAR, str(self._placement_timeout_s)):
                if not refresh:
                    return super().fit()
                with _ResourceRefresher(self._resource_refresh_s):
                    return super().fit()
        except ControllerError as exc:
            if isinstance(exc.controller_failure, WorkerGroupStartupTimeoutError):
                need = resources_per_worker(self.scaling_config)
                raise PlacementTimeoutError(
                    f"{self.scaling_config.num_workers} worker(s) needing {need} each were not placed within "
                    f"{self._placement_timeout_s:g} s, although the nodes could hold them ({fits}): the "
                    f"resources are held by other jobs or actors, or a node left the cluster; raise "
                    f"placement_timeout_s to wait longer") from exc
            raise
