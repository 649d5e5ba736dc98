"""Algorithm choice (csrc/algo/select.c, issue 18): MCCL_ALGO forces a family for every
collective, as NCCL_ALGO does, the choice is logged once per collective kind at INFO, and results
stay exact whatever runs."""
from __future__ import annotations

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


def test_unknown_mccl_algo_is_a_warning_and_changes_nothing():
    env = {"MCCL_ALGO": "bogus", "MCCL_DEBUG": "INFO", "MCCL_DEBUG_SUBSYS": "COLL"}
    for v in check_ok(run_ranks(_run, 2, env=env, deadline_s=60)):
        assert v["exact"]
        assert "MCCL_ALGO=bogus is not 'ring', 'tree', 'doubling' or 'twolevel'" in v["log"], v["log"]
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


def _alpha_beta_on_last_rank(rank: int, world_size: int) -> None:
    if rank == world_size - 1:  # libmccl reads its variables once, at the first init: set before it
        os.environ["MCCL_ALPHA_BETA"] = "1M"


def _broadcast_raises(rank: int, world_size: int) -> str:
    buf = torch.arange(1 << 14, dtype=torch.float32) if rank == 0 else torch.full((1 << 14,), -1.0)
    try:
        dist.broadcast(buf, 0)
    except Exception as exc:  # noqa: BLE001: every rank must raise; the text is checked below
        untouched = rank == 0 or bool((buf == -1).all())
        return f"{'untouched' if untouched else 'WRITTEN'}: {exc}"
    return "no error"


def test_unequal_mccl_alpha_beta_fails_every_rank_with_a_mismatch():
    """The promise in docs/ENVIRONMENT.md: ranks given different values choose different
    broadcasts, and every rank raises a mismatch instead of receiving wrong data."""
    values = check_ok(run_ranks(_broadcast_raises, 3, pre_init=_alpha_beta_on_last_rank, deadline_s=60,
                                pg_timeout_s=20))
    for r, v in enumerate(values):
        assert v.startswith("untouched: ") and "mismatch" in v, (r, v)
