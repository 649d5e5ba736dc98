"""Run a function on N ranks in fresh processes, each with a deadline, and collect what each returns.

Every multi-process test goes through :func:`run_ranks`: it spawns ``world_size`` processes, each
initialises ``backend`` over a FileStore (no port races between concurrent tests), calls
``fn(rank, world_size, *args)`` and sends back its return value or its exception text. The parent
kills every process that is still alive when the deadline passes and fails the test, so no test can
hang.
"""
from __future__ import annotations

import hashlib
import io
import multiprocessing as mp
import os
import queue
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable


@dataclass
class RankResult:
    rank: int
    ok: bool
    value: Any = None
    error: str = ""
    elapsed: float = 0.0


def _entry(fn, rank, world_size, store_path, backend, pg_timeout_s, args, out):
    start = time.monotonic()
    try:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if backend == "mccl":
            import mccl  # noqa: F401  (registers the backend)
        if backend is not None:
            dist.init_process_group(
                backend,
                init_method=f"file://{store_path}",
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=pg_timeout_s),
            )
        value = fn(rank, world_size, *args)
        # Tensors travel as bytes: torch's queue pickling would hand over shared-memory file
        # descriptors that die with this process.
        buf = io.BytesIO()
        torch.save(value, buf)
        out.put(RankResult(rank, True, buf.getvalue(), elapsed=time.monotonic() - start))
        if backend is not None and dist.is_initialized():
            dist.destroy_process_group()
    except BaseException as exc:  # reported to the parent, which fails the test
        out.put(RankResult(rank, False, error=f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}",
                           elapsed=time.monotonic() - start))


def run_ranks(fn: Callable, world_size: int, *args, backend: str | None = "mccl",
              deadline_s: float = 120.0, pg_timeout_s: float = 60.0) -> list[RankResult]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` spawned ranks.

    Returns one :class:`RankResult` per rank, in rank order; a rank that exited without reporting
    gets ``ok=False``. Raises ``AssertionError`` when the deadline passes (after killing every rank
    still running).
    """
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_entry, args=(fn, r, world_size, store_path, backend, pg_timeout_s, args, out),
                             daemon=True) for r in range(world_size)]
        for p in procs:
            p.start()
        results: dict[int, RankResult] = {}
        until = time.monotonic() + deadline_s
        try:
            while len(results) < world_size:
                left = until - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"deadline of {deadline_s:.0f} s passed; ranks "
                                         f"{sorted(set(range(world_size)) - set(results))} never finished (hang)")
                try:
                    res = out.get(timeout=min(left, 0.5))
                    results[res.rank] = res
                    continue
                except queue.Empty:
                    pass
                # A rank that exited without reporting (killed, os._exit) gets a failed result;
                # give its queue a moment first, since a put may still be in flight.
                gone = [r for r, p in enumerate(procs) if r not in results and not p.is_alive()]
                if gone:
                    time.sleep(0.5)
                    while True:
                        try:
                            res = out.get(timeout=0.1)
                        except queue.Empty:
                            break
                        results[res.rank] = res
                    for r in gone:
                        if r not in results:
                            results[r] = RankResult(r, False, error=f"exited with code {procs[r].exitcode} without reporting")
        finally:
            for p in procs:
                p.join(timeout=max(0.0, min(10.0, until - time.monotonic())))
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
    import torch

    for res in results.values():
        if res.ok:
            res.value = torch.load(io.BytesIO(res.value), weights_only=False)
    return [results[r] for r in range(world_size)]


def check_ok(results: list[RankResult]) -> list[Any]:
    """Assert every rank succeeded; return their values in rank order."""
    failures = [f"rank {r.rank}: {r.error}" for r in results if not r.ok]
    assert not failures, "\n".join(failures)
    return [r.value for r in results]


def digest(tensor) -> str:
    """A digest of a tensor's bytes, to compare ranks bitwise."""
    import torch

    t = tensor.detach().contiguous().cpu().view(-1)
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()
