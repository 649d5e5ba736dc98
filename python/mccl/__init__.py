"""MCCL: a collective-communication library over TCP, as the torch.distributed backend ``"mccl"``.

Importing this package registers the backend, so an unmodified script only changes its backend
name::

    import mccl  # registers "mccl"
    import torch.distributed as dist
    dist.init_process_group(backend="mccl")   # env:// rendezvous, e.g. under torchrun

Every byte of every collective is moved, ordered and reduced by the C library (``include/mccl.h``)
over one TCP connection per peer pair; this package only registers it and passes tensors through.
"""
from __future__ import annotations

import atexit
import datetime
import os
import torch
import torch.distributed as dist

from . import _torch_guard

_torch_guard.check_torch(torch.__version__)  # before _C loads: under another torch it could abort

from . import _C  # noqa: E402

__all__ = ["BACKEND_NAME", "DEVICES", "version"]

BACKEND_NAME = "mccl"
#: Device types whose tensors the backend accepts: cpu (barrier and the object collectives use it),
#: cuda (staged through pinned host memory, ordered on the streams), and mps where this build has
#: Apple's Metal support (macOS). One group may mix them: each rank uses its own device.
DEVICES = ["cpu", "cuda"] + (["mps"] if getattr(_C, "has_mps", False) else [])
version = tuple(_C.version)


def _create_backend(opts, pg_options=None) -> _C.ProcessGroupMCCL:
    """Backend creator called by ``init_process_group``/``new_group`` (torch's extended API).

    ``opts`` is torch's ``_DistributedBackendOptions``: ``opts.store`` is already prefixed for the
    group; ``opts.timeout`` bounds init and is the default deadline of every collective;
    ``opts.group_id`` (torch's group name: "0" for the default group) names the communicator in
    the C library's log lines and errors ("group 0"). MASTER_ADDR, when set, picks the network
    interface whose route leads to it (``MCCL_SOCKET_IFNAME`` overrides that). ``pg_options`` is
    not used: mccl has no per-group options.
    """
    label = f"group {opts.group_id}" if getattr(opts, "group_id", "") else ""
    return _C.ProcessGroupMCCL(opts.store, opts.group_rank, opts.group_size, _group_timeout(opts.timeout),
                               os.environ.get("MASTER_ADDR", ""), label)


def _group_timeout(timeout: datetime.timedelta) -> datetime.timedelta:
    """A group's timeout as the C library takes it, in whole milliseconds: a positive one under a
    millisecond is 1 ms (not 0, which libmccl would read as its 30-minute default); zero or a
    negative one is refused with ValueError (torch's own default, 30 minutes, is what
    ``timeout=None`` gives)."""
    if timeout.total_seconds() <= 0:
        raise ValueError(f"mccl: a process group's timeout must be positive, got {timeout!r} "
                         "(leave it unset for torch's default of 30 minutes)")
    return max(timeout, datetime.timedelta(milliseconds=1))


def _exit_wait_s() -> float:
    """MCCL_EXIT_WAIT_S: seconds (0 to 86400, default 10) the interpreter's exit waits for
    operations still in flight and their Future callbacks before it aborts this process's groups
    (docs/ENVIRONMENT.md); ValueError names a bad value."""
    raw = os.environ.get("MCCL_EXIT_WAIT_S", "10")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 86400:
        raise ValueError(f"mccl: MCCL_EXIT_WAIT_S must be a number of seconds from 0 to 86400, got {raw!r}")
    return seconds


# Completion threads run Future callbacks and drop the Works they finished, and with them
# references to tensors Python also holds: both take the GIL, so they must be done before the
# interpreter finalizes (a thread taking the GIL then is ended mid-destructor, which aborts the
# process). So the exit waits for every operation issued and its completion, up to
# MCCL_EXIT_WAIT_S, then aborts the groups and waits for the callbacks that follow.
# atexit runs hooks last-in first-out, so a user's hook registered after this
# import (one that destroys process groups, or runs a last collective) runs first.
# ProcessGroupMCCL.cpp, Completer::atExit.
atexit.register(_C._completions_at_exit, _exit_wait_s())

from . import _order  # noqa: E402

_order.install()  # callbacks' collectives run where the callback was attached (mccl/_order.py)

if BACKEND_NAME not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=DEVICES)
