"""Process groups over mccl (issue 3, groups acceptance).

`new_group` and subgroups each get their own communicator; several groups in one process work at
the same time (interleaved async work, concurrent threads, overlapping memberships); groups can be
destroyed and created again; and init -> destroy -> init in the same processes works the ways a
user would do it (a TCPStore the user keeps, env:// on the same MASTER_PORT, file:// on the same
path). Inputs are small integers, so every result is exact and compared with ``torch.equal``.
"""
import os
import socket
import tempfile
import threading
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from distributed import check_ok, digest, run_ranks


def _full(v, n=5, dtype=torch.float32):
    return torch.full((n,), float(v), dtype=dtype)


def _member_sum(ranks, fn):
    return float(sum(fn(r) for r in ranks))


def _subgroups(rank: int, world_size: int) -> dict:
    n = world_size
    out = {}
    world_backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    # Every rank calls new_group for every group, in the same order (torch's rule).
    pairs = [[q, (q + 1) % n] for q in range(n)] if n > 2 else [[0, 1]]
    pair_groups = [dist.new_group(sorted(p)) for p in pairs]
    everyone = dist.new_group(list(range(n)))
    singles = [dist.new_group([q]) for q in range(n)]
    backends = [world_backend]  # kept alive, so identity is meaningful
    for ranks, g in zip(pairs, pair_groups):
        if rank not in ranks:
            assert g == dist.GroupMember.NON_GROUP_MEMBER
            continue
        assert dist.get_backend(g) == "mccl"
        assert g.size() == 2 and dist.get_rank(g) == sorted(ranks).index(rank)
        b = g._get_backend(torch.device("cpu"))
        assert b.name() == "mccl"
        backends.append(b)
        # all_reduce, broadcast from each member (global rank), all_gather, reduce_scatter.
        t = _full(rank + 1)
        dist.all_reduce(t, group=g)
        assert torch.equal(t, _full(_member_sum(ranks, lambda r: r + 1))), f"all_reduce on {ranks}"
        for src in ranks:
            b_t = _full(10 * src + 3) if rank == src else torch.zeros(5)
            dist.broadcast(b_t, src=src, group=g)
            assert torch.equal(b_t, _full(10 * src + 3)), f"broadcast from {src} on {ranks}"
        outs = [torch.empty(3, dtype=torch.int64) for _ in range(2)]
        dist.all_gather(outs, torch.arange(3) + 100 * rank, group=g)
        for i, q in enumerate(sorted(ranks)):
            assert torch.equal(outs[i], torch.arange(3) + 100 * q)
        rs = torch.empty(2)
        dist.reduce_scatter_tensor(rs, torch.arange(4.0) + rank, group=g)
        gr = dist.get_rank(g)
        assert torch.equal(rs, sum(torch.arange(4.0) + q for q in ranks)[2 * gr:2 * gr + 2])
        out[f"pair{sorted(ranks)}"] = digest(t)
    backends.append(everyone._get_backend(torch.device("cpu")))
    t = _full(rank * 3, dtype=torch.int64)
    dist.all_reduce(t, group=everyone, op=dist.ReduceOp.MAX)
    assert torch.equal(t, _full(3 * (n - 1), dtype=torch.int64))
    # A group of one: every collective is the identity.
    mine = singles[rank]
    t = _full(rank + 7)
    dist.all_reduce(t, group=mine)
    dist.broadcast(t, src=rank, group=mine)
    assert torch.equal(t, _full(rank + 7))
    backends.append(mine._get_backend(torch.device("cpu")))
    # The default group still works after all of that, and was not disturbed by it.
    t = _full(1)
    dist.all_reduce(t)
    assert torch.equal(t, _full(n))
    memberships = sum(rank in p for p in pairs)
    assert len(backends) == 1 + memberships + 2
    assert len({id(b) for b in backends}) == len(backends), "groups share a backend object"
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_new_group_subsets_each_work_exactly(world_size):
    digests = check_ok(run_ranks(_subgroups, world_size, deadline_s=120))
    for r in range(world_size):
        for key, d in digests[r].items():
            for q in range(world_size):
                if key in digests[q]:
                    assert digests[q][key] == d, f"{key}: ranks {r} and {q} differ"


def _interleaved(rank: int, world_size: int) -> dict:
    """Two groups over the same ranks, async work issued in a different order on each rank: only
    independent communicators can serve this (a shared ordered queue would deadlock or mix them)."""
    n = world_size
    ga = dist.new_group(list(range(n)))
    gb = dist.new_group(list(range(n)))
    works, tensors = [], []
    order = [(ga, "a"), (gb, "b")] if rank % 2 == 0 else [(gb, "b"), (ga, "a")]
    if rank == 1:
        time.sleep(0.5)  # the other ranks' first operations are surely pending
    for k in range(6):
        for g, name in order:
            size = 7 if name == "a" else 70001  # one small, one past the ring threshold
            t = torch.full((size,), float(rank + 1 + k + (100 if name == "b" else 0)))
            works.append(dist.all_reduce(t, group=g, async_op=True))
            tensors.append((name, k, t))
    for w in works:
        w.wait()
    for name, k, t in tensors:
        expected = float(sum(r + 1 + k + (100 if name == "b" else 0) for r in range(n)))
        assert torch.equal(t, torch.full_like(t, expected)), f"group {name} step {k}"
    return {f"{name}{k}": digest(t) for name, k, t in tensors}


@pytest.mark.parametrize("world_size", [2, 3])
def test_groups_with_async_work_in_different_orders(world_size):
    digests = check_ok(run_ranks(_interleaved, world_size, deadline_s=120, pg_timeout_s=30))
    assert all(d == digests[0] for d in digests)


def _threads(rank: int, world_size: int) -> list:
    """Each of three threads runs blocking collectives on its own group, all at the same time."""
    n = world_size
    groups = [dist.new_group(list(range(n))) for _ in range(3)]
    errors, results = [], [None] * 3
    barrier = threading.Barrier(3)

    def work(i):
        try:
            barrier.wait()
            acc = torch.zeros(4, dtype=torch.int64)
            for k in range(25):
                t = torch.full((4 + 1000 * (k % 3),), rank + 10 * i + k, dtype=torch.int64)
                dist.all_reduce(t, group=groups[i])
                assert torch.equal(t, torch.full_like(t, sum(r + 10 * i + k for r in range(n)))), (i, k)
                g = [torch.empty(2, dtype=torch.int64) for _ in range(n)]
                dist.all_gather(g, torch.tensor([rank, i]), group=groups[i])
                assert [x.tolist() for x in g] == [[r, i] for r in range(n)]
                acc += t[:4]
            results[i] = acc
        except BaseException as exc:  # noqa: BLE001  (reported below)
            errors.append(f"thread {i}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=90)
    assert not any(th.is_alive() for th in threads), "a thread never finished"
    assert not errors, errors
    return [digest(r) for r in results]


@pytest.mark.parametrize("world_size", [2, 3])
def test_groups_used_from_concurrent_threads(world_size):
    digests = check_ok(run_ranks(_threads, world_size, deadline_s=150, pg_timeout_s=60))
    assert all(d == digests[0] for d in digests)


def _overlapping_and_recreated(rank: int, world_size: int) -> None:
    """Overlapping groups used back to back; a destroyed group is created again; subgroups by
    enumeration; a group made with use_local_synchronization by its members only; a gloo group
    next to the mccl default group."""
    n = world_size
    # new_subgroups_by_enumeration: [0, 2, 4, ...] and [1, 3, ...].
    cur, subs = dist.new_subgroups_by_enumeration([list(range(0, n, 2)), list(range(1, n, 2))])
    members = list(range(rank % 2, n, 2))
    t = _full(rank + 1)
    dist.all_reduce(t, group=cur)
    assert torch.equal(t, _full(_member_sum(members, lambda r: r + 1)))
    for cycle in range(3):
        g = dist.new_group(list(range(n)))
        t = _full(rank + cycle)
        dist.all_reduce(t, group=g)
        assert torch.equal(t, _full(_member_sum(range(n), lambda r: r + cycle))), f"cycle {cycle}"
        dist.destroy_process_group(g)
    if rank < 2:
        local = dist.new_group([0, 1], use_local_synchronization=True)
        t = _full(rank + 5)
        dist.all_reduce(t, group=local)
        assert torch.equal(t, _full(11))
    side = dist.new_group(list(range(n)), backend="gloo")
    t = _full(rank + 1)
    dist.all_reduce(t, group=side)
    u = _full(rank + 1)
    dist.all_reduce(u)
    assert torch.equal(t, u)
    assert dist.get_backend(side) == "gloo" and dist.get_backend() == "mccl"
    dist.barrier()


@pytest.mark.parametrize("world_size", [2, 3])
def test_overlapping_recreated_local_and_mixed_backend_groups(world_size):
    check_ok(run_ranks(_overlapping_and_recreated, world_size, deadline_s=120))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _reinit(rank: int, world_size: int, mode: str, port: int, path: str) -> list:
    """init -> collectives (default group and a new_group) -> destroy, three times in one process."""
    import mccl  # noqa: F401

    timeout = timedelta(seconds=30)
    store = None
    if mode == "tcpstore":  # the user keeps one store and hands it to every init
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=(rank == 0), timeout=timeout)
    sums = []
    for cycle in range(3):
        if mode == "tcpstore":
            dist.init_process_group("mccl", store=store, rank=rank, world_size=world_size, timeout=timeout)
        elif mode == "env":  # what torchrun-style scripts do
            os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
            dist.init_process_group("mccl", init_method="env://", rank=rank, world_size=world_size, timeout=timeout)
        else:  # file:// on the same path every time
            dist.init_process_group("mccl", init_method=f"file://{path}", rank=rank, world_size=world_size,
                                    timeout=timeout)
        assert dist.get_backend() == "mccl" and dist.get_world_size() == world_size
        t = torch.full((1000,), float(rank + 1 + 10 * cycle))
        dist.all_reduce(t)
        g = dist.new_group(list(range(world_size)))
        dist.all_reduce(t, group=g)
        dist.broadcast(t, src=world_size - 1)
        sums.append(t[0].item())
        assert torch.equal(t, torch.full_like(t, t[0].item()))
        dist.destroy_process_group()
        assert not dist.is_initialized()
    return sums


@pytest.mark.parametrize("mode,world_size", [("tcpstore", 2), ("env", 2), ("env", 3), ("file", 2)])
def test_init_destroy_init_again(mode, world_size):
    with tempfile.TemporaryDirectory() as tmp:
        results = check_ok(run_ranks(_reinit, world_size, mode, _free_port(), os.path.join(tmp, "store"),
                                     backend=None, deadline_s=150))
    n = world_size
    expected = [float(n * sum(r + 1 + 10 * c for r in range(n))) for c in range(3)]
    assert all(r == expected for r in results), results
