"""Topology-ordered rings (csrc/core/topology.h, issue 18): ranks of one group (switch) are
contiguous in every ring whatever the launcher's rank order, and results are exact and bitwise
equal on every rank. The groups come from MCCL_TOPOLOGY_GROUP, set per rank before init."""
from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from distributed import check_ok, digest, run_ranks
from mccl import trace

N = 1 << 18  # elements: rings for every collective below (MCCL_RING_THRESHOLD is 256 KiB)


def _set_group(rank: int, world_size: int) -> None:
    """pre_init: this rank's group, from the comma list in TEST_GROUPS."""
    os.environ["MCCL_TOPOLOGY_GROUP"] = os.environ["TEST_GROUPS"].split(",")[rank]


def _collectives(rank: int, world_size: int) -> dict:
    n = world_size
    x = torch.arange(N, dtype=torch.float32) % 251 + rank  # integer-valued: sums are exact
    dist.all_reduce(x)
    ref = (torch.arange(N, dtype=torch.float64) % 251) * n + n * (n - 1) / 2
    gathered = torch.empty(N * n)
    dist.all_gather_into_tensor(gathered, torch.full((N,), float(rank)))
    rs = torch.empty(N // n)
    dist.reduce_scatter_tensor(rs, torch.arange(N // n * n, dtype=torch.float32) % 7 + rank)
    rs_ref = (torch.arange(N // n * n, dtype=torch.float64) % 7 * n + n * (n - 1) / 2)[rank * (N // n):(rank + 1) * (N // n)]
    b = torch.full((N,), float(rank))
    dist.broadcast(b, src=n - 1)
    red = torch.full((N,), float(rank + 1))
    dist.reduce(red, dst=1)
    exact = {
        "all_reduce": torch.equal(x.double(), ref),
        "all_gather": torch.equal(gathered, torch.arange(n, dtype=torch.float32).repeat_interleave(N)),
        "reduce_scatter": torch.equal(rs.double(), rs_ref),
        "broadcast": bool((b == n - 1).all()),
        "reduce": rank != 1 or bool((red == n * (n + 1) / 2).all()),
    }
    dist.destroy_process_group()  # writes the trace
    return {"exact": exact, "digest": digest(x)}


@pytest.mark.parametrize("groups, ring", [
    (["A", "B", "A", "B"], [0, 2, 1, 3]),                 # the launcher interleaved two switches
    (["A", "B", "B", "A", "C"], [0, 3, 1, 2, 4]),         # uneven groups
    (["s", "s", "s"], [0, 1, 2]),                         # one group: rank order
])
def test_rings_keep_each_group_together(tmp_path, groups, ring):
    n = len(groups)
    prefix = str(tmp_path / "t")
    values = check_ok(run_ranks(_collectives, n, pre_init=_set_group, deadline_s=120,
                                env={"MCCL_TRACE": prefix, "TEST_GROUPS": ",".join(groups)}))
    for r, v in enumerate(values):
        assert all(v["exact"].values()), (r, v["exact"])
    assert len({v["digest"] for v in values}) == 1
    # Each rank's ring all-reduce (#0) sent to its successor in ring order and to nobody else.
    for pos, r in enumerate(ring):
        data = trace.load(f"{prefix}.group_0.rank{r}.json")
        to = {e["tid"] for e in data["traceEvents"] if e.get("ph") == "X" and e["name"] == "send"
              and e["args"]["seq"] == 0 and e["args"]["bytes"] > 0}
        assert to == {1 + 2 * ring[(pos + 1) % n]}, (r, sorted(to))


def _two_level(rank: int, world_size: int) -> dict:
    import tempfile

    n = world_size
    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    results = {}
    try:
        for count in (n, 1000003, 1 << 18):  # a chunk of 1 element, sizes that split unevenly
            x = (torch.arange(count, dtype=torch.float64) % 1009 + rank).float()
            ref = (torch.arange(count, dtype=torch.float64) % 1009) * n + n * (n - 1) / 2
            dist.all_reduce(x)
            y = torch.full((count,), float(4 * (rank + 1)))
            dist.all_reduce(y, op=dist.ReduceOp.AVG)  # AVG divides once, by n
            results[count] = {"sum": torch.equal(x.double(), ref),
                              "avg": bool((y == 2.0 * (n + 1)).all()), "digest": digest(x)}
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    log.seek(0)
    text = log.read().decode(errors="replace")
    plans = {l.split(" runs as ")[1].split(";")[0] for l in text.splitlines() if "allreduce of" in l and " runs as " in l}
    return {"results": results, "plans": plans}


@pytest.mark.parametrize("groups", [
    ["A", "A", "B", "B"], ["A", "B", "A", "B"], ["A", "A", "B", "B", "C", "C"], ["A", "A", "A", "B", "B", "B"],
    ["a", "b", "c", "d", "a", "b", "c", "d"],
])
def test_two_level_ring_is_exact_and_bitwise_equal(groups):
    n = len(groups)
    values = check_ok(run_ranks(_two_level, n, pre_init=_set_group, deadline_s=180, env={
        "TEST_GROUPS": ",".join(groups), "MCCL_ALGO": "twolevel", "MCCL_DEBUG": "INFO", "MCCL_DEBUG_SUBSYS": "COLL"}))
    for r, v in enumerate(values):
        assert v["plans"] == {"two-level (forced, MCCL_ALGO)"}, (r, v["plans"])
        for count, res in v["results"].items():
            assert res["sum"] and res["avg"], (r, count, res)
    for count in values[0]["results"]:
        assert len({v["results"][count]["digest"] for v in values}) == 1, count


def test_two_level_needs_equal_groups_else_the_flat_ring():
    values = check_ok(run_ranks(_two_level, 3, pre_init=_set_group, deadline_s=120, env={
        "TEST_GROUPS": "A,A,B", "MCCL_ALGO": "twolevel", "MCCL_DEBUG": "INFO", "MCCL_DEBUG_SUBSYS": "COLL"}))
    for v in values:
        assert v["plans"] == {"ring (forced two-level, but the topology has no equal groups of 2 or more ranks, "
                              "MCCL_ALGO)"}, v["plans"]
        assert all(res["sum"] and res["avg"] for res in v["results"].values())
