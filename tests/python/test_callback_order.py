"""Collectives issued from Future callbacks run in the same place on every rank (issue 16).

The reproduction: ``w1`` (a large all-reduce) and ``w2`` (4 floats) are issued, rank 0 sleeps, then
every rank attaches ``w1.get_future().then(cb)`` where ``cb`` all-reduces another 4-float tensor
``c``. On rank 0, ``w1`` has finished by then and torch runs ``cb`` at once; on the others it runs
later on the completion pool. Before order markers, rank 0 ran ``w1, w2, c`` and the others
``w1, c, w2``: the headers matched and ``b`` and ``c`` were summed with each other. Variants: the
callback issues on another group; it is attached to a point-to-point Work; it issues two
collectives; it issues none; it is attached early (DDP's way) and waits for its own collective.
Values are small integers so every check is exact.
"""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from distributed import check_ok, run_ranks, start_script_ranks

BIG = 1 << 22  # 16 MiB of float32: the ring, long enough that rank 0's sleep decides


def _repro(rank: int, world_size: int, variant: str) -> dict:
    other = dist.new_group(backend="mccl") if variant == "other_group" else None
    r1 = rank + 1
    a = torch.full((BIG,), float(r1))
    b = torch.full((4,), 10.0 * r1)
    c = torch.full((4,), 100.0 * r1)
    c2 = torch.full((5,), 1000.0 * r1)
    d = torch.full((4,), 7.0 * r1)
    if variant == "p2p":
        peer = (rank + 1) % world_size
        send = dist.isend(torch.full((3,), float(rank)), dst=peer)
        got = torch.empty(3)
        w1 = dist.irecv(got, src=(rank - 1) % world_size)
    else:
        send = None
        w1 = dist.all_reduce(a, async_op=True)
    w2 = dist.all_reduce(b, async_op=True)
    if rank == 0:
        time.sleep(1.0)  # rank 0's w1 has finished by the attach; the others' has not
    ran = []

    def cb(fut):
        ran.append(time.monotonic())
        if variant == "none":
            return None
        group = other if variant == "other_group" else None
        dist.all_reduce(c, group=group)
        if variant == "two":
            dist.all_reduce(c2)
        return None

    f = w1.get_future().then(cb)
    w3 = dist.all_reduce(d, async_op=True)  # issued after the attach: after cb's collectives
    f.wait()
    for w in (w2, w3):
        w.wait()
    if send is not None:
        send.wait()
    total = world_size * (world_size + 1) // 2
    out = {"b": b.tolist(), "d": d.tolist(), "ran": len(ran)}
    ok = torch.equal(b, torch.full((4,), 10.0 * total)) and torch.equal(d, torch.full((4,), 7.0 * total))
    if variant != "none":
        ok = ok and torch.equal(c, torch.full((4,), 100.0 * total))
        out["c"] = c.tolist()
    if variant == "two":
        ok = ok and torch.equal(c2, torch.full((5,), 1000.0 * total))
    if variant == "p2p":
        ok = ok and torch.equal(got, torch.full((3,), float((rank - 1) % world_size)))
    else:
        ok = ok and torch.equal(a, torch.full((BIG,), float(total)))
    out["ok"] = bool(ok)
    return out


@pytest.mark.parametrize("variant", ["plain", "other_group", "p2p", "two", "none"])
def test_callback_collectives_run_where_attached(variant):
    values = check_ok(run_ranks(_repro, 2, variant, deadline_s=120))
    for r, v in enumerate(values):
        assert v["ran"] == 1, f"rank {r}: the callback ran {v['ran']} times"
        assert v["ok"], f"rank {r} ({variant}): {v}"


def _early_attach_waits(rank: int, world_size: int) -> bool:
    """DDP's way (PowerSGD): attach at once; the callback issues a collective and waits for it,
    while the main thread issues more collectives; a chain of then() on the derived Future too."""
    total = world_size * (world_size + 1) // 2
    works, futs = [], []
    for k in range(6):
        t = torch.full((1000 + k,), float(rank + 1))
        w = dist.all_reduce(t, async_op=True)
        q = torch.full((7 + k,), float(10 * (rank + 1)))
        s = torch.full((3,), float(100 * (rank + 1)))

        def first(fut, q=q):
            dist.all_reduce(q, async_op=True).get_future().wait()
            return q

        def second(fut, s=s):
            dist.all_reduce(s)
            return s

        futs.append((w.get_future().then(first).then(second), t, q, s, k))
        if rank == k % world_size:
            time.sleep(0.05)  # a different rank lags each time
        works.append(w)
    for fut, t, q, s, k in futs:
        fut.wait()
        assert torch.equal(t, torch.full((1000 + k,), float(total)))
        assert torch.equal(q, torch.full((7 + k,), float(10 * total)))
        assert torch.equal(s, torch.full((3,), float(100 * total)))
    return True


def test_early_attached_callbacks_that_wait_and_chain():
    assert all(check_ok(run_ranks(_early_attach_waits, 3, deadline_s=120)))


def test_a_script_leaving_while_a_callback_runs_exits_zero_after_it():
    """The interpreter exits while the completion thread sleeps in a Python callback, without
    destroy_process_group. Before the atexit hook (mccl/__init__.py), the callback woke to a
    finalizing interpreter and the rank aborted ("Fatal Python error", exit 134). Now the exit
    waits for the callback: each rank prints the callback's exact sum and exits 0. Rank 1's
    callback is attached before the all-reduce can complete (scripts/exit_during_callback.py),
    so it runs on the completion thread after LEAVING; rank 0's may run inline, before it."""
    import subprocess

    world = 2
    store, procs = start_script_ranks("exit_during_callback.py", world, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT)
    try:
        outs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{out[-3000:]}"
        lines = out.split()
        assert "LEAVING" in lines and f"CALLBACK {world * (world + 1) // 2}" in out, f"rank {r}:\n{out[-3000:]}"
    assert outs[1].index("LEAVING") < outs[1].index("CALLBACK"), f"rank 1's callback ended before the exit:\n{outs[1]}"
