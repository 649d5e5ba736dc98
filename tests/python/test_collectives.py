"""Collectives through ``init_process_group("mccl")`` on 1-4 ranks against exact references.

Inputs are small integers, so every dtype's result is exact and compared with ``torch.equal``;
references are computed locally in float64/int64 from every rank's inputs. Every result's bytes
are digested and compared across ranks.
"""
import pytest
import torch
import torch.distributed as dist

from distributed import check_ok, digest, run_ranks

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool]
OPS = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}
# Element counts: empty, tiny, odd, and one past the ring threshold (256 KiB of float32).
COUNTS = [0, 1, 13, 70001]


def rank_input(rank: int, count: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    """Rank ``rank``'s input: small integers (products of up to 4 ranks stay exact in fp16)."""
    i = torch.arange(count, dtype=torch.int64)
    if dtype == torch.bool:
        return ((i % 5 == 0) | ((i + rank) % 3 == 0))
    if op == "product":
        v = torch.tensor([1, 2, -1, -2, 1])[(i * 3 + rank) % 5]
    else:
        v = (i * 7 + rank * 13) % 11 - 5
    if dtype == torch.uint8:
        v = v.abs()
    return v.to(dtype)


def reference(world_size: int, count: int, dtype: torch.dtype, op: str) -> torch.Tensor:
    xs = torch.stack([rank_input(r, count, dtype, op) for r in range(world_size)])
    if dtype == torch.bool:
        return xs.any(0) if op in ("sum", "max") else xs.all(0)
    wide = xs.to(torch.float64) if dtype.is_floating_point else xs.to(torch.int64)
    if op in ("sum", "avg"):
        total = wide.sum(0)
    elif op == "product":
        total = wide.prod(0)
    elif op == "min":
        total = wide.min(0).values
    else:
        total = wide.max(0).values
    if op != "avg":
        return total.to(dtype)
    if not dtype.is_floating_point:
        return torch.div(total, world_size, rounding_mode="trunc").to(dtype)
    if dtype == torch.float64:
        return total / world_size
    # float32 and the half types: the exact sum divided once in fp32, then rounded to the dtype.
    return (total.to(torch.float32) / world_size).to(dtype)


def _all_collectives(rank: int, world_size: int) -> dict:
    digests = {}
    for dtype in DTYPES:
        for name, op in OPS.items():
            if dtype == torch.bool and name == "avg":
                continue
            for count in COUNTS:
                t = rank_input(rank, count, dtype, name)
                work = dist.all_reduce(t, op=op, async_op=(count % 2 == 1))
                if work is not None:
                    work.wait()
                ref = reference(world_size, count, dtype, name)
                assert t.dtype == dtype and t.shape == ref.shape
                assert torch.equal(t, ref), f"all_reduce {name} {dtype} count={count}: {t[:8]} != {ref[:8]}"
                digests[f"allreduce/{name}/{dtype}/{count}"] = digest(t)
    for root in range(world_size):
        for dtype in (torch.float32, torch.int64, torch.bool, torch.bfloat16):
            for count in COUNTS:
                expected = rank_input(root, count, dtype, "sum")
                t = expected.clone() if rank == root else torch.zeros(count, dtype=dtype)
                dist.broadcast(t, src=root)
                assert torch.equal(t, expected), f"broadcast root={root} {dtype} count={count}"
                digests[f"broadcast/{root}/{dtype}/{count}"] = digest(t)
    for dtype in (torch.float32, torch.int8, torch.bool, torch.float16):
        for count in COUNTS:
            mine = rank_input(rank, count, dtype, "sum")
            outs = [torch.empty(count, dtype=dtype) for _ in range(world_size)]
            dist.all_gather(outs, mine)
            for r in range(world_size):
                assert torch.equal(outs[r], rank_input(r, count, dtype, "sum")), f"all_gather from {r}"
            flat = torch.empty(count * world_size, dtype=dtype)
            dist.all_gather_into_tensor(flat, mine)
            assert torch.equal(flat, torch.cat([rank_input(r, count, dtype, "sum") for r in range(world_size)]))
            digests[f"allgather/{dtype}/{count}"] = digest(flat)
    for _ in range(3):
        dist.barrier()
    return digests


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_collectives_exact_and_bitwise_equal(world_size):
    digests = check_ok(run_ranks(_all_collectives, world_size, deadline_s=240))
    for r in range(1, world_size):
        assert digests[r] == digests[0], f"rank {r}'s results differ bitwise from rank 0's"
    # Every case above actually ran: all-reduce (op x dtype less bool AVG), broadcast per root, all-gather.
    assert len(digests[0]) == (len(OPS) * len(DTYPES) - 1) * len(COUNTS) + 4 * len(COUNTS) * (world_size + 1)


def _async_burst(rank: int, world_size: int) -> str:
    """Many collectives in flight at once, waited only at the end: issue order must hold."""
    tensors = [torch.full((1 + 977 * k,), float(rank + k), dtype=torch.float32) for k in range(40)]
    works = [dist.all_reduce(t, async_op=True) for t in tensors]
    futures = [w.get_future() for w in works]
    torch.futures.wait_all(futures)
    for k, t in enumerate(tensors):
        expected = float(sum(r + k for r in range(world_size)))
        assert torch.equal(t, torch.full_like(t, expected)), f"tensor {k}"
        assert torch.equal(futures[k].value()[0], t)  # the Future carries the output tensor list
    return digest(torch.cat(tensors))


def test_async_burst_in_issue_order():
    digests = check_ok(run_ranks(_async_burst, 3))
    assert len(set(digests)) == 1
