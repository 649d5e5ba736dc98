"""Object collectives with mccl as the only backend (issue 3, object-collectives acceptance).

torch pickles each object into a uint8 tensor, exchanges the sizes (int64) and then the bytes, on
the device torch picks for the group. With only mccl registered (no gloo anywhere), every one of
broadcast_object_list, all_gather_object, gather_object and scatter_object_list must round-trip
exactly, for every root, for objects of very different sizes (padding) and for large objects
(past the ring threshold), on the default group and on a subgroup.
"""
import pytest
import torch
import torch.distributed as dist

from distributed import check_ok, run_ranks


class Payload:
    """A user class (module level, so every rank can unpickle it)."""

    def __init__(self, rank: int, blob_len: int = 0) -> None:
        self.attr = rank
        self.blob = bytes((rank * 31 + i) % 251 for i in range(blob_len))

    def __eq__(self, other) -> bool:
        return isinstance(other, Payload) and (self.attr, self.blob) == (other.attr, other.blob)


def _obj(rank: int, kind: int):
    """Rank ``rank``'s object number ``kind``: sizes from a few bytes to ~1.2 MB, varying by rank."""
    if kind == 0:
        return f"rank-{rank}"
    if kind == 1:
        return {"rank": rank, "t": torch.arange(5, dtype=torch.int64) * rank, "nested": [rank, (rank, None)]}
    if kind == 2:
        return Payload(rank, blob_len=300_000 * (rank + 1))  # very different sizes across ranks
    return None


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def _objects(rank: int, world_size: int) -> dict:
    n = world_size
    # Only mccl is registered for the default group: no gloo fallback behind the object collectives.
    assert dist.get_backend() == "mccl"
    assert "gloo" not in str(dist.get_backend_config()), dist.get_backend_config()
    kinds = range(4)
    for src in range(n):
        objs = [_obj(rank, k) for k in kinds]
        dist.broadcast_object_list(objs, src=src)
        for k in kinds:
            assert _same(objs[k], _obj(src, k)), f"broadcast_object_list src {src} kind {k}"
    for k in kinds:
        got = [None] * n
        dist.all_gather_object(got, _obj(rank, k))
        for q in range(n):
            assert _same(got[q], _obj(q, k)), f"all_gather_object kind {k} from {q}"
    for dst in range(n):
        for k in (0, 2):
            got = [None] * n if rank == dst else None
            dist.gather_object(_obj(rank, k), got, dst=dst)
            if rank == dst:
                for q in range(n):
                    assert _same(got[q], _obj(q, k)), f"gather_object dst {dst} kind {k} from {q}"
    for src in range(n):
        for k in (1, 2):
            out = [None]
            dist.scatter_object_list(out, [_obj(q, k) for q in range(n)] if rank == src else None, src=src)
            assert _same(out[0], _obj(rank, k)), f"scatter_object_list src {src} kind {k}"
    # An explicit device argument (cpu) takes the same path.
    objs = [_obj(rank, 1)]
    dist.broadcast_object_list(objs, src=n - 1, device=torch.device("cpu"))
    assert _same(objs[0], _obj(n - 1, 1))
    # On a subgroup, with global ranks as src/dst.
    members = [0, n - 1]
    g = dist.new_group(members)
    if rank in members:
        got = [None] * 2
        dist.all_gather_object(got, _obj(rank, 2), group=g)
        assert [x.attr for x in got] == members and all(_same(got[i], _obj(q, 2)) for i, q in enumerate(members))
        objs = [_obj(rank, 0)]
        dist.broadcast_object_list(objs, src=n - 1, group=g)
        assert objs == [_obj(n - 1, 0)]
        out = [None]
        dist.scatter_object_list(out, [_obj(q, 1) for q in members] if rank == 0 else None, src=0, group=g)
        assert _same(out[0], _obj(rank, 1))
        got = [None] * 2 if rank == n - 1 else None
        dist.gather_object(_obj(rank, 0), got, dst=n - 1, group=g)
        if rank == n - 1:
            assert got == [_obj(q, 0) for q in members]
    # The default group still agrees afterwards: nothing was left half-sent.
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(n)))
    return {"ok": True}


@pytest.mark.parametrize("world_size", [2, 3])
def test_object_collectives_with_mccl_only(world_size):
    check_ok(run_ranks(_objects, world_size, deadline_s=150))
