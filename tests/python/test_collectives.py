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


def _tensors_freed(rank: int, world_size: int) -> list:
    """A collective's tensors are freed once the caller drops them: the Work, its Future and the
    Futures derived by then() keep no reference after completion (a fresh-eyes test found every
    output kept alive by a registry of Futures, about one tensor per call)."""
    import gc
    import time
    import weakref

    n = 70001
    kept = []
    for it in range(6):
        b = torch.full((n,), float(it)) if rank == 0 else torch.empty(n)
        a = torch.full((n,), float(rank + it))
        outs = [torch.empty(n) for _ in range(world_size)]
        work_b = dist.broadcast(b, 0, async_op=it % 2 == 1)
        work_a = dist.all_reduce(a, async_op=True)
        child = work_a.get_future().then(lambda f: f.value()[0].sum().item())  # a derived Future
        dist.all_gather(outs, a.clone())
        if work_b is not None:
            work_b.wait()
        assert child.wait() == float(sum(r + it for r in range(world_size))) * n
        assert torch.equal(b, torch.full((n,), float(it)))
        refs = [weakref.ref(t) for t in (b, a, *outs)]
        del b, a, outs, work_b, work_a, child
        # wait() returns once the Future completed; the completion thread lets go of the Work (and
        # its outputs) just after, so allow it a moment. The leak kept them for good.
        deadline = time.monotonic() + 10
        while True:
            gc.collect()
            alive = [r() is not None for r in refs]
            if not any(alive) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        kept.append(alive)
    return kept


def test_tensors_are_freed_once_the_caller_drops_them():
    for rank, kept in enumerate(check_ok(run_ranks(_tensors_freed, 3))):
        for it, alive in enumerate(kept):
            assert not any(alive), f"rank {rank}, iteration {it}: tensors still alive after del: {alive}"


def _rest_of_surface(rank: int, world_size: int) -> dict:
    """reduce, reduce_scatter (list and tensor), gather, scatter, all_to_all (single, uneven, list),
    PREMUL_SUM and the coalesced forms, with exact references."""
    n = world_size
    out = {}
    for dtype in (torch.float32, torch.int64, torch.bfloat16, torch.int8):
        for name in ("sum", "max", "avg"):
            if name == "avg" and not dtype.is_floating_point:
                continue
            for root in range(n):
                t = rank_input(rank, 1001, dtype, name)
                before = t.clone()
                dist.reduce(t, dst=root, op=OPS[name])
                if rank == root:
                    assert torch.equal(t, reference(n, 1001, dtype, name)), f"reduce {name} {dtype} root {root}"
                else:
                    assert torch.equal(t, before), "reduce wrote a non-root tensor"
    # F10: list form, rank q's input_list[j] holds 10q + j; tensor form arange(4n) + 100q.
    outl = torch.zeros(4)
    dist.reduce_scatter(outl, [torch.full((4,), 10.0 * rank + j) for j in range(n)])
    assert torch.equal(outl, torch.full((4,), 10.0 * sum(range(n)) + n * rank))
    outt = torch.zeros(4)
    dist.reduce_scatter_tensor(outt, torch.arange(4.0 * n) + 100 * rank)
    expected = sum(torch.arange(4.0 * n) + 100 * q for q in range(n))[4 * rank:4 * rank + 4]
    assert torch.equal(outt, expected)
    for name in ("sum", "avg", "max"):
        for count in (1, 70001):
            full = rank_input(rank, count * n, torch.float32, name)
            got = torch.empty(count, dtype=torch.float32)
            dist.reduce_scatter_tensor(got, full, op=OPS[name])
            ref = reference(n, count * n, torch.float32, name)[rank * count:(rank + 1) * count]
            assert torch.equal(got, ref), f"reduce_scatter_tensor {name} count {count}"
    # PREMUL_SUM (what FSDP2 sends): factor 1/2 on even integers.
    premul = dist._make_nccl_premul_sum(0.5)
    x = torch.full((37,), 2.0 * (rank + 1))
    dist.all_reduce(x, op=premul)
    assert torch.equal(x, torch.full((37,), float(sum(r + 1 for r in range(n)))))
    y = torch.empty(5, dtype=torch.bfloat16)
    dist.reduce_scatter_tensor(y, torch.full((5 * n,), 2.0 * (rank + 1), dtype=torch.bfloat16), op=premul)
    assert torch.equal(y, torch.full((5,), float(sum(r + 1 for r in range(n))), dtype=torch.bfloat16))
    # gather / scatter from the last rank.
    root = n - 1
    mine = torch.arange(6, dtype=torch.int32) + 10 * rank
    bucket = [torch.empty(6, dtype=torch.int32) for _ in range(n)] if rank == root else None
    dist.gather(mine, bucket, dst=root)
    if rank == root:
        for q in range(n):
            assert torch.equal(bucket[q], torch.arange(6, dtype=torch.int32) + 10 * q)
    got = torch.empty(3, dtype=torch.float64)
    dist.scatter(got, [torch.full((3,), float(q)) .double() for q in range(n)] if rank == root else None, src=root)
    assert torch.equal(got, torch.full((3,), float(rank), dtype=torch.float64))
    # all_to_all_single, equal splits: element j*k of rank q's input is 100q + j.
    k = 3
    src = torch.cat([torch.full((k,), 100 * rank + j, dtype=torch.int64) for j in range(n)])
    dst = torch.empty(n * k, dtype=torch.int64)
    dist.all_to_all_single(dst, src)
    assert torch.equal(dst, torch.cat([torch.full((k,), 100 * q + rank, dtype=torch.int64) for q in range(n)]))
    # Uneven: rank q sends q + j + 1 rows of width 2 to rank j.
    in_splits = [rank + j + 1 for j in range(n)]
    out_splits = [q + rank + 1 for q in range(n)]
    src = torch.cat([torch.full((s, 2), float(100 * rank + j)) for j, s in enumerate(in_splits)])
    dst = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(dst, src, out_splits, in_splits)
    assert torch.equal(dst, torch.cat([torch.full((s, 2), float(100 * q + rank)) for q, s in enumerate(out_splits)]))
    outs = [torch.empty(q + 1) for q in range(n)]
    dist.all_to_all(outs, [torch.full((rank + 1,), float(rank * 10 + j)) for j in range(n)])
    for q in range(n):
        assert torch.equal(outs[q], torch.full((q + 1,), float(q * 10 + rank)))
    # Zero-element tensors are no-ops everywhere.
    empty = torch.empty(0)
    dist.reduce(empty, dst=0)
    dist.reduce_scatter_tensor(torch.empty(0), torch.empty(0))
    dist.all_to_all_single(torch.empty(0), torch.empty(0))
    out["reduce_scatter"] = digest(outt)
    return out


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_rest_of_surface_exact(world_size):
    check_ok(run_ranks(_rest_of_surface, world_size, deadline_s=180))


def _strided_views(rank: int, world_size: int) -> None:
    """Non-contiguous tensors and storage offsets give correct results (staged through a copy)."""
    n = world_size
    base = torch.arange(24.0).reshape(4, 6) + rank
    t = base.t()  # non-contiguous, every element moves
    dist.all_reduce(t)
    assert torch.equal(t, (torch.arange(24.0).reshape(4, 6) * n + sum(range(n))).t())
    assert torch.equal(base, t.t())  # the write went into the caller's storage
    storage = torch.zeros(20)
    tail = storage[7:]  # storage offset 7
    tail.copy_(torch.full((13,), float(rank + 1)))
    dist.all_reduce(tail)
    assert torch.equal(storage[:7], torch.zeros(7))
    assert torch.equal(tail, torch.full((13,), float(sum(r + 1 for r in range(n)))))
    every_other = torch.zeros(10)[::2]
    if rank == 0:
        every_other.copy_(torch.arange(5.0))
    dist.broadcast(every_other, src=0)
    assert torch.equal(every_other, torch.arange(5.0))
    out = torch.zeros(n, 3).t()  # a non-contiguous (3, n) output: filled in its logical order
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank)))
    assert torch.equal(out.reshape(-1), torch.cat([torch.full((3,), float(q)) for q in range(n)]))


@pytest.mark.parametrize("world_size", [2, 3])
def test_strided_views_and_offsets(world_size):
    check_ok(run_ranks(_strided_views, world_size))


def _point_to_point(rank: int, world_size: int) -> None:
    """F19's send of [1, 2, 3], uneven traffic, irecv before a collective, any-source, batch_isend_irecv."""
    n = world_size
    right, left = (rank + 1) % n, (rank - 1) % n
    if rank == 0:
        dist.send(torch.tensor([1, 2, 3]), dst=1)
    elif rank == 1:
        got = torch.zeros(3, dtype=torch.int64)
        dist.recv(got, src=0)
        assert torch.equal(got, torch.tensor([1, 2, 3]))
    # Uneven: rank r sends r + 1 messages to its right; collectives in between stay in step.
    works = [dist.isend(torch.full((1000 * k + 1,), float(rank * 10 + k)), dst=right, tag=3) for k in range(rank + 1)]
    dist.all_reduce(torch.ones(4))
    for k in range(left + 1):
        buf = torch.empty(1000 * k + 1)
        dist.recv(buf, src=left, tag=3)
        assert torch.equal(buf, torch.full_like(buf, float(left * 10 + k)))
    for w in works:
        w.wait()
    # A receive posted before an all-reduce whose matching send comes after it.
    got = torch.empty(2)
    req = dist.irecv(got, src=left, tag=7)
    x = torch.ones(5)
    dist.all_reduce(x)
    dist.send(torch.full((2,), float(rank)), dst=right, tag=7)
    req.wait()
    assert torch.equal(got, torch.full((2,), float(left))) and torch.equal(x, torch.full((5,), float(n)))
    # Any source: everyone tells rank 0 its rank.
    if rank == 0:
        seen = set()
        for _ in range(n - 1):
            buf = torch.empty(1, dtype=torch.int64)
            src = dist.recv(buf, tag=9)
            assert src == buf.item()
            seen.add(src)
        assert seen == set(range(1, n))
    else:
        dist.send(torch.tensor([rank]), dst=0, tag=9)
    # batch_isend_irecv, as pipeline-parallel code uses it.
    out = torch.empty(4)
    ops = [dist.P2POp(dist.isend, torch.full((4,), float(rank)), right), dist.P2POp(dist.irecv, out, left)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert torch.equal(out, torch.full((4,), float(left)))


@pytest.mark.parametrize("world_size", [2, 3])
def test_point_to_point(world_size):
    check_ok(run_ranks(_point_to_point, world_size))


WIDE_INTS = {torch.int16: (16, True), torch.uint16: (16, False), torch.uint32: (32, False), torch.uint64: (64, False)}


def _wrap(v: int, bits: int, signed: bool) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


def _more_int_dtypes(rank: int, world_size: int) -> dict:
    """int16, uint16, uint32, uint64: every reduce op exact (sums and products wrap around as in
    two's complement), broadcast and all_gather; references in Python integers."""
    out = {}
    for dtype, (bits, signed) in WIDE_INTS.items():
        top = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
        # Values near the top of the range, so sums and products wrap; small ones for AVG.
        mine = [top - 3 * rank, rank + 1, (7 * rank + 3) % 11, top // 2 + rank]
        everyone = [[top - 3 * r, r + 1, (7 * r + 3) % 11, top // 2 + r] for r in range(world_size)]
        ops = {"sum": (dist.ReduceOp.SUM, lambda xs: sum(xs)), "product": (dist.ReduceOp.PRODUCT, lambda xs: _prod(xs)),
               "max": (dist.ReduceOp.MAX, max), "min": (dist.ReduceOp.MIN, min),
               "band": (dist.ReduceOp.BAND, lambda xs: _fold(xs, int.__and__)),
               "bor": (dist.ReduceOp.BOR, lambda xs: _fold(xs, int.__or__)),
               "bxor": (dist.ReduceOp.BXOR, lambda xs: _fold(xs, int.__xor__))}
        for name, (op, ref) in ops.items():
            t = torch.tensor(mine, dtype=dtype)
            dist.all_reduce(t, op=op)
            want = [_wrap(ref([e[i] for e in everyone]), bits, signed) for i in range(4)]
            assert t.dtype == dtype and t.tolist() == want, f"all_reduce {name} {dtype}: {t.tolist()} != {want}"
        small = torch.tensor([3 * rank + 1, 2], dtype=dtype)
        dist.all_reduce(small, op=dist.ReduceOp.AVG)
        assert small.tolist() == [sum(3 * r + 1 for r in range(world_size)) // world_size, 2], f"avg {dtype}"
        if signed:  # README: an integer AVG rounds toward zero (C, NCCL), not down (Python's //)
            neg = torch.tensor([-1, -(world_size + 1)] if rank == 0 else [0, 0], dtype=dtype)
            dist.all_reduce(neg, op=dist.ReduceOp.AVG)
            assert neg.tolist() == [0, -1], f"avg {dtype} of negatives: {neg.tolist()}"
        b = torch.tensor(mine if rank == 0 else [0, 0, 0, 0], dtype=dtype)
        dist.broadcast(b, src=0)
        assert b.tolist() == everyone[0]
        outs = [torch.zeros(4, dtype=dtype) for _ in range(world_size)]
        dist.all_gather(outs, torch.tensor(mine, dtype=dtype))
        assert [o.tolist() for o in outs] == everyone
        out[str(dtype)] = t.tolist()
    return out


def _prod(xs):
    p = 1
    for x in xs:
        p *= x
    return p


def _fold(xs, f):
    acc = xs[0]
    for x in xs[1:]:
        acc = f(acc, x)
    return acc


@pytest.mark.parametrize("world_size", [2, 3])
def test_int16_uint16_uint32_uint64(world_size):
    values = check_ok(run_ranks(_more_int_dtypes, world_size))
    assert all(v == values[0] for v in values)
