"""What torch.distributed users reach for beyond the basics (issue 16): sparse all-reduce (DDP's
sparse gradients), all_gather with outputs of different sizes per rank, and errors that name the
group. Integer-valued data, so every check is exact."""
from __future__ import annotations

import os
import tempfile

import pytest

import torch
import torch.distributed as dist

from distributed import check_ok, digest, run_ranks


def _uneven_all_gather(rank: int, world_size: int) -> str:
    mine = torch.arange(rank + 1, dtype=torch.int64) + 10 * rank
    outs = [torch.full((p + 1,), -1, dtype=torch.int64) for p in range(world_size)]
    dist.all_gather(outs, mine)
    for p in range(world_size):
        assert torch.equal(outs[p], torch.arange(p + 1, dtype=torch.int64) + 10 * p), f"from rank {p}: {outs[p]}"
    # Several dims, floating point, async.
    x = torch.full((rank + 1, 3), float(rank))
    ys = [torch.empty(p + 1, 3) for p in range(world_size)]
    dist.all_gather(ys, x, async_op=True).wait()
    assert all(torch.equal(ys[p], torch.full((p + 1, 3), float(p))) for p in range(world_size))
    return digest(torch.cat(outs))


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_gather_outputs_of_different_sizes(world_size):
    values = check_ok(run_ranks(_uneven_all_gather, world_size))
    assert len(set(values)) == 1


def _uneven_disagree(rank: int, world_size: int) -> str:
    # Rank 1 expects 3 elements from rank 0, which sends 1.
    mine = torch.ones(rank + 1)
    outs = [torch.empty((3 if (rank == 1 and p == 0) else p + 1)) for p in range(world_size)]
    try:
        dist.all_gather(outs, mine)
        return "no error"
    except RuntimeError as exc:
        return str(exc)


def test_all_gather_sizes_that_disagree_fail_every_rank():
    values = check_ok(run_ranks(_uneven_disagree, 2, pg_timeout_s=20))
    for r, v in enumerate(values):
        assert "mismatch" in v.lower(), f"rank {r}: {v}"


def _sparse_all_reduce(rank: int, world_size: int) -> dict:
    # Rank r holds rows r and r+1 (overlapping its neighbour's) of a (6, 2) matrix, twice row r.
    idx = torch.tensor([[rank, rank + 1, rank]])
    val = torch.tensor([[1.0 + rank, 2.0], [10.0 * (rank + 1), 0.5], [3.0, -1.0]])
    t = torch.sparse_coo_tensor(idx, val, (6, 2))
    dense_ref = sum(torch.sparse_coo_tensor(torch.tensor([[q, q + 1, q]]),
                                            torch.tensor([[1.0 + q, 2.0], [10.0 * (q + 1), 0.5], [3.0, -1.0]]),
                                            (6, 2)).to_dense() for q in range(world_size))
    dist.all_reduce(t)
    assert t.is_sparse and torch.equal(t.to_dense(), dense_ref), f"{t.to_dense()} != {dense_ref}"
    out = {"indices": digest(t.coalesce().indices()), "values": digest(t.coalesce().values())}
    with pytest.raises(RuntimeError, match="summed"):
        dist.all_reduce(torch.sparse_coo_tensor(idx, val, (6, 2)), op=dist.ReduceOp.MAX)
    # An empty sparse tensor on one rank.
    e = torch.sparse_coo_tensor(torch.zeros((1, 0), dtype=torch.int64), torch.zeros((0, 2)), (6, 2)) if rank == 0 \
        else torch.sparse_coo_tensor(idx, val, (6, 2))
    dist.all_reduce(e)
    want = sum(torch.sparse_coo_tensor(torch.tensor([[q, q + 1, q]]),
                                       torch.tensor([[1.0 + q, 2.0], [10.0 * (q + 1), 0.5], [3.0, -1.0]]),
                                       (6, 2)).to_dense() for q in range(1, world_size))
    assert torch.equal(e.to_dense(), want)
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_sparse_all_reduce_exact_and_bitwise_equal(world_size):
    values = check_ok(run_ranks(_sparse_all_reduce, world_size))
    assert all(v == values[0] for v in values)


def _sparse_ddp(rank: int, world_size: int) -> dict:
    gloo = dist.new_group(backend="gloo")
    params = {}
    for name, group in (("mccl", None), ("gloo", gloo)):
        torch.manual_seed(0)
        model = torch.nn.EmbeddingBag(50, 4, mode="sum", sparse=True)
        with torch.no_grad():
            model.weight.copy_(torch.arange(200, dtype=torch.float32).reshape(50, 4) % 7)
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.25)
        gen = torch.Generator().manual_seed(10 + rank)
        for _ in range(5):
            inp = torch.randint(0, 50, (8, 3), generator=gen)
            target = torch.randint(-2, 3, (8, 4), generator=gen).float()
            opt.zero_grad()
            (ddp(inp) * target).sum().backward()
            opt.step()
        params[name] = model.weight.detach().clone()
    return {"equal": bool(torch.equal(params["mccl"], params["gloo"])), "digest": digest(params["mccl"])}


def test_ddp_with_sparse_embeddings_matches_gloo_exactly():
    values = check_ok(run_ranks(_sparse_ddp, 2, deadline_s=180))
    assert all(v["equal"] for v in values), values
    assert values[0]["digest"] == values[1]["digest"]


def _named_group_error(rank: int, world_size: int) -> dict:
    # The C library's own lines (stderr) name the communicator by torch's group name too.
    log = tempfile.TemporaryFile()
    saved = os.dup(2)
    os.dup2(log.fileno(), 2)
    try:
        g = dist.new_group(backend="mccl", group_desc="encoder_tp")
        try:
            dist.all_reduce(torch.ones(4 if rank == 0 else 5), group=g)
            error = "no error"
        except RuntimeError as exc:
            error = str(exc)
        name = dist.distributed_c10d._get_process_group_name(g)
    finally:
        os.dup2(saved, 2)
        os.close(saved)
    log.seek(0)
    return {"error": error, "name": name, "log": log.read().decode(errors="replace")}


def test_errors_and_log_lines_name_the_group():
    values = check_ok(run_ranks(_named_group_error, 2, pg_timeout_s=20, env={"MCCL_DEBUG": "INFO"}))
    for r, v in enumerate(values):
        assert "encoder_tp" in v["error"] and "mismatch" in v["error"].lower(), f"rank {r}: {v['error']}"
        label = f"'group {v['name']}'"
        # The init line and the failure warning of the subgroup, each naming it.
        assert f"rank {r}/2 of {label} generation" in v["log"], v["log"]
        assert f"communicator {label} failed" in v["log"], v["log"]
        assert "'pg'" not in v["log"], v["log"]
