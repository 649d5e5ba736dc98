"""Bad input and lost peers: a clear error on every rank, in time, and nothing sent by mistake."""
import os
import time

import pytest
import torch
import torch.distributed as dist

from distributed import check_ok, run_ranks


def _refuses(fn, *match):
    try:
        fn()
    except RuntimeError as exc:
        text = str(exc)
        assert all(m in text for m in match), f"error text {text!r} lacks {match}"
        return text
    raise AssertionError(f"expected an error mentioning {match}")


def _bad_arguments(rank: int, world_size: int) -> None:
    # Each call must fail on the caller's thread, before any byte is sent: the valid all_reduce
    # after each would otherwise see a peer's stray frame (a mismatch) or hang.
    ok = torch.ones(8)
    cases = [
        (lambda: dist.all_reduce(torch.ones(4, dtype=torch.int16)), ("unsupported dtype", "Short")),
        (lambda: dist.all_reduce(torch.ones(1).expand(4)), ("share memory", "expand")),
        (lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG), ("avg", "bool")),
        (lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND), ("band", "float32")),
        # torch's frontend skips meta tensors, so hand one to the backend object itself.
        (lambda: dist.group.WORLD._get_backend(torch.device("cpu")).allreduce([torch.ones(4, device="meta")]),
         ("device meta",)),
        (lambda: dist.all_reduce(torch.ones(4).to_sparse()), ("strided",)),
        (lambda: dist.all_gather([torch.ones(3)] * world_size, torch.ones(4)), ("all_gather", "size")),
        (lambda: dist.all_gather_into_tensor(torch.ones(3), torch.ones(4)), ("expected world size",)),
    ]
    for call, match in cases:
        _refuses(call, *match)
        dist.all_reduce(ok)
    assert torch.equal(ok, torch.full((8,), float(world_size) ** len(cases)))


def test_bad_arguments_raise_before_sending():
    check_ok(run_ranks(_bad_arguments, 2))


def _peer_exits(rank: int, world_size: int) -> dict:
    dist.barrier()
    if rank == world_size - 1:
        os._exit(0)  # disappear without destroying anything, mid-job
    start = time.monotonic()
    t = torch.ones(1 << 20)
    try:
        for _ in range(50):
            dist.all_reduce(t)
    except dist.DistBackendError as exc:
        return {"error": str(exc), "seconds": time.monotonic() - start}
    return {"error": None}


def test_lost_peer_is_named_on_every_rank_within_timeout():
    results = run_ranks(_peer_exits, 3, pg_timeout_s=20, deadline_s=90)
    survivors = [r for r in results if r.rank != 2]
    values = check_ok(survivors)
    for r, v in zip(survivors, values):
        assert v["error"] is not None, f"rank {r.rank} never noticed that rank 2 left"
        assert "rank 2" in v["error"], v["error"]
        assert v["seconds"] < 20, f"rank {r.rank} took {v['seconds']:.1f} s"


def _mismatched_sizes(rank: int, world_size: int) -> str:
    t = torch.ones(100 if rank == 0 else 200)
    try:
        dist.all_reduce(t)
    except RuntimeError as exc:
        return str(exc)
    return ""


def test_mismatched_sizes_fail_on_every_rank():
    messages = check_ok(run_ranks(_mismatched_sizes, 2, pg_timeout_s=20, deadline_s=60))
    for rank, msg in enumerate(messages):
        assert msg, f"rank {rank} returned without an error"
        assert "mismatch" in msg, msg
