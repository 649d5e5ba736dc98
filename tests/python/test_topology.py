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
