"""Algorithm choice (csrc/algo/select.c, issue 18): MCCL_ALGO forces a family for every
collective, as NCCL_ALGO does, the choice is logged once per collective kind at INFO, and results
stay exact whatever runs."""
from __future__ import annotations

import functools
import os
import tempfile

import pytest
import torch
import torch.distributed as dist

from distributed import check_ok, run_ranks


def _run(rank: int, world_size: int) -> dict:
    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
        small, big = torch.full((16,), float(rank + 1)), torch.full((1 << 18,), float(rank + 1))
        dist.all_reduce(small)
        dist.all_reduce(big)
        out = torch.empty(16 * world_size)
        dist.all_gather_into_tensor(out, torch.full((16,), float(rank)))
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    log.seek(0)
    want = world_size * (world_size + 1) / 2
    exact = bool((small == want).all() and (big == want).all()) and torch.equal(
        out, torch.arange(world_size, dtype=torch.float32).repeat_interleave(16))
    return {"exact": exact, "log": log.read().decode(errors="replace")}


def _plans(log: str, coll: str) -> set[str]:
    """The plans logged for collective `coll`: "ring (forced, MCCL_ALGO)", ..."""
    return {l.split(" runs as ")[1].split(";")[0] for l in log.splitlines() if f"{coll} of " in l and " runs as " in l}


@pytest.mark.parametrize("algo, allreduce, allgather", [
    # By size: the 16-element all-reduce takes doubling, the 256 Ki-element one the ring.
    (None, {"doubling (small)", "ring (size >= MCCL_RING_THRESHOLD)"}, {"bruck (small)"}),
    ("ring", {"ring (forced, MCCL_ALGO)"}, {"ring (forced, MCCL_ALGO)"}),
    ("tree", {"doubling (forced, MCCL_ALGO)"}, {"bruck (forced, MCCL_ALGO)"}),
    # Halving-doubling is an all-reduce algorithm: the other collectives take the ring.
    ("halving", {"halving-doubling (forced, MCCL_ALGO)"}, {"ring (forced, MCCL_ALGO)"}),
])
def test_mccl_algo_forces_and_logs_the_choice(algo, allreduce, allgather):
    env = {"MCCL_DEBUG": "INFO", "MCCL_DEBUG_SUBSYS": "COLL"}
    if algo:
        env["MCCL_ALGO"] = algo
    for r, v in enumerate(check_ok(run_ranks(_run, 3, env=env, deadline_s=60))):
        assert v["exact"], r
        assert _plans(v["log"], "allreduce") == allreduce, v["log"]
        assert _plans(v["log"], "allgather") == allgather, v["log"]
        # Each (collective, plan) is logged once per communicator, however often it runs.
        lines = [l.split(" MCCL INFO ")[1] for l in v["log"].splitlines() if " runs as " in l]
        assert len(lines) == len(allreduce) + len(allgather), lines


_init_log = None  # a rank's stderr during init (_log_init), read back by _run_after_init


def _log_init(rank: int, world_size: int) -> None:
    global _init_log
    _init_log = tempfile.TemporaryFile()
    os.dup2(_init_log.fileno(), 2)  # _run puts its own file in place afterwards


def _run_after_init(rank: int, world_size: int) -> dict:
    out = _run(rank, world_size)
    _init_log.seek(0)
    out["init_log"] = _init_log.read().decode(errors="replace")
    return out


def test_unknown_mccl_algo_is_a_warning_and_changes_nothing():
    env = {"MCCL_ALGO": "bogus", "MCCL_DEBUG": "INFO", "MCCL_DEBUG_SUBSYS": "COLL"}
    for v in check_ok(run_ranks(_run_after_init, 2, env=env, pre_init=_log_init, deadline_s=60)):
        assert v["exact"]
        # Read at init, where every rank's settings are compared (one warning per process).
        assert "MCCL_ALGO=bogus is not 'ring', 'tree', 'doubling', 'twolevel' or 'halving'" in v["init_log"], v["init_log"]
        assert "allreduce of 16 float32 runs as doubling (small)" in v["log"], v["log"]


def _broadcast(rank: int, world_size: int) -> dict:
    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
        want = torch.arange(1 << 14, dtype=torch.float32)  # 64 KiB, under MCCL_RING_THRESHOLD
        buf = want.clone() if rank == 0 else torch.full((1 << 14,), -1.0)
        dist.broadcast(buf, 0)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    log.seek(0)
    return {"exact": torch.equal(buf, want), "log": log.read().decode(errors="replace")}


@pytest.mark.parametrize("alpha_beta, plan", [
    # 3 ranks: (ceil(log2 3) - 2 x 2/3) x 64 KiB = 43.7 KB against alpha x beta.
    (None, "scatter-allgather ((log2 n - 2(n-1)/n) S > alpha x beta)"),  # the default, 32 KiB
    ("1M", "tree (small)"),
])
def test_mccl_alpha_beta_moves_the_broadcast_choice(alpha_beta, plan):
    env = {"MCCL_DEBUG": "INFO", "MCCL_DEBUG_SUBSYS": "COLL"}
    if alpha_beta:
        env["MCCL_ALPHA_BETA"] = alpha_beta
    for r, v in enumerate(check_ok(run_ranks(_broadcast, 3, env=env, deadline_s=60))):
        assert v["exact"], r
        assert _plans(v["log"], "broadcast") == {plan}, v["log"]


def _noop(rank: int, world_size: int) -> str:
    return "initialised"


def _set_on_last_rank(var: str, value: str, rank: int, world_size: int) -> None:
    if rank == world_size - 1:  # libmccl reads its variables once, at the first init: set before it
        os.environ[var] = value


@pytest.mark.parametrize("var, value", [
    ("MCCL_ALPHA_BETA", "1M"), ("MCCL_ALGO", "ring"), ("MCCL_SEGMENT_BYTES", "64K"),
    ("MCCL_RING_THRESHOLD", "1M"), ("MCCL_ANNOUNCE_RANKS", "0"), ("MCCL_RUNTIME_CONNECT", "1"),
    ("MCCL_CHAIN_RELAY", "0"),
])
def test_a_setting_that_differs_between_ranks_fails_every_rank_at_init(var, value):
    """The promise in docs/ENVIRONMENT.md: a variable every rank must be given alike, set on one
    rank only, fails init on every rank with the variable, both values and both ranks named
    (every rank judges the same table of records), instead of a collective mismatch later, or,
    for the connection settings, ranks that wait on each other until the timeout."""
    results = run_ranks(_noop, 3, pre_init=functools.partial(_set_on_last_rank, var, value), deadline_s=60, pg_timeout_s=30)
    for r in results:
        assert not r.ok, (r.rank, r.value)
        assert f"{var} is " in r.error and "on rank 2 but" in r.error and "on rank 0" in r.error, r.error
        assert f"every rank of a job must be given the same {var}" in r.error, r.error
        assert r.elapsed < 20, (r.rank, r.elapsed)


def _init_where_rank0_hosts_the_store(rank: int, world_size: int, port: int, var: str, value: str) -> str:
    from datetime import timedelta

    import mccl  # noqa: F401

    if rank == 0:
        os.environ[var] = value
    # As torch's env:// init does outside torchrun: rank 0's process is the store's server.
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    try:
        dist.init_process_group("mccl", store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=20))
    except Exception as exc:  # returned at once: rank 0's process exits, and its store with it
        return f"raised: {exc}"
    return "initialised"


def test_a_differing_setting_on_rank_0_is_named_on_every_rank_even_when_rank_0_hosts_the_store():
    """Found by a fresh-eyes test: rank 0 read the table, failed init and exited, taking the store
    down before the others had read the table; they failed on "the store's connection closed",
    without the cause. Rank 0 now waits (core/comm.c initFailedLinger) until the others have failed."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    values = check_ok(run_ranks(_init_where_rank0_hosts_the_store, 3, port, "MCCL_RING_THRESHOLD", "1K",
                                backend=None, deadline_s=60))
    for r, v in enumerate(values):
        assert "MCCL_RING_THRESHOLD is " in v and "on rank 0" in v, (r, v)
