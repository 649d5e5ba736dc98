"""fork() after init (issue 16): in a child, every call on an inherited group fails at once with an
error that says so; a new group in the child works; DataLoader workers (forked after init) do no
harm; the parent's job goes on with exact results."""
from __future__ import annotations

import os
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from distributed import check_ok, run_ranks


def _child(rank: int, store_dir: str, world_size: int) -> int:
    """Runs in the forked child; returns its exit status (0: as expected)."""
    try:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4))
            return 10  # an inherited group must not work
        except RuntimeError as exc:
            if "fork" not in str(exc) or time.monotonic() - t0 > 2.0:
                return 11
        # A group of the children's own, over a store of their own.
        store = dist.FileStore(os.path.join(store_dir, "children"), world_size)
        import mccl

        pg = mccl._C.ProcessGroupMCCL(store, rank, world_size, timedelta(seconds=30), "127.0.0.1")
        t = torch.full((5,), float(rank + 1))
        pg.allreduce([t]).wait()
        return 0 if torch.equal(t, torch.full((5,), float(world_size * (world_size + 1) // 2))) else 12
    except BaseException:  # noqa: BLE001
        return 13


def _fork_after_init(rank: int, world_size: int, store_dir: str) -> dict:
    x = torch.full((1 << 20,), float(rank + 1))
    w = dist.all_reduce(x, async_op=True)  # in flight across the fork
    pid = os.fork()
    if pid == 0:
        os._exit(_child(rank, store_dir, world_size))
    w.wait()
    _, status = os.waitpid(pid, 0)
    # The parents' group goes on, exact, after the child's exit too.
    y = torch.full((1000,), float(10 * (rank + 1)))
    dist.all_reduce(y)
    total = world_size * (world_size + 1) // 2
    # DataLoader workers forked after init (the test harness's rank processes are daemonic, which
    # multiprocessing would refuse children: this rank stands for a training script's process).
    import multiprocessing

    multiprocessing.current_process()._config["daemon"] = False
    data = torch.utils.data.TensorDataset(torch.arange(64.0))
    loader = torch.utils.data.DataLoader(data, batch_size=8, num_workers=2,
                                         multiprocessing_context="fork")
    seen = sum(float(b[0].sum()) for b in loader)
    z = torch.ones(3)
    dist.all_reduce(z)
    return {"child": os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1,
            "x": bool(torch.equal(x, torch.full_like(x, float(total)))),
            "y": bool(torch.equal(y, torch.full_like(y, 10.0 * total))),
            "loader": seen == float(sum(range(64))), "z": bool(torch.equal(z, torch.full((3,), float(world_size))))}


def test_fork_after_init():
    with tempfile.TemporaryDirectory() as d:
        values = check_ok(run_ranks(_fork_after_init, 2, d, deadline_s=120))
    for r, v in enumerate(values):
        assert v == {"child": 0, "x": True, "y": True, "loader": True, "z": True}, f"rank {r}: {v}"
