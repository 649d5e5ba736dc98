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

import os
import sys
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


def _exit_script(world: int, first: int, then_set: str | None = None):
    """Run scripts/exit_during_callback.py on ``world`` plain rank processes (its mode from the
    environment); wait for rank ``first`` to exit, note when (time.time()), set the store key
    ``then_set`` if given, then wait for the others. Returns (procs, outputs by rank, that time)."""
    import subprocess

    store, procs = start_script_ranks("exit_during_callback.py", world, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT)
    outs = [""] * world
    try:
        outs[first] = procs[first].communicate(timeout=120)[0]
        exited = time.time()
        if then_set:
            store.set(then_set, "1")
        for r in range(world):
            if r != first:
                outs[r] = procs[r].communicate(timeout=120)[0]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return procs, outs, exited


@pytest.mark.parametrize("mode", ["callback_running", "in_flight"])
def test_a_script_leaving_while_a_callback_runs_exits_zero_after_it(mode, monkeypatch):
    """The interpreter exits, without destroy_process_group, while mccl still owes a Python
    callback: ``callback_running``, the completion thread sleeps in it; ``in_flight``, the
    all-reduce it is attached to has not even completed (rank 0 never waits for it, and rank 1
    issues its own only after rank 0's main code has ended). Before the atexit hook
    (mccl/__init__.py) the callback woke to a finalizing interpreter and the rank aborted ("Fatal
    Python error", exit 134; "terminate called without an active exception", -6); the hook waited
    only for posted callbacks, so ``in_flight`` still aborted. Now the exit waits for the
    collectives issued and their callbacks: each rank prints the callback's exact sum and exits
    0. The order LEAVING, then CALLBACK is guaranteed on one rank (scripts/exit_during_callback.py
    says why) and checked there; the other's callback may run inline, before it."""
    world = 2
    monkeypatch.setenv("MCCL_TEST_EXIT_MODE", mode)
    procs, outs, _ = _exit_script(world, first=0)
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{out[-3000:]}"
        lines = out.split()
        assert "LEAVING" in lines and f"CALLBACK {world * (world + 1) // 2}" in out, f"rank {r}:\n{out[-3000:]}"
        assert "aborting this process's process groups" not in out, f"rank {r}:\n{out[-3000:]}"
    ordered = 1 if mode == "callback_running" else 0
    assert outs[ordered].index("LEAVING") < outs[ordered].index("CALLBACK"), \
        f"rank {ordered}'s callback ended before the exit:\n{outs[ordered]}"


@pytest.mark.parametrize("mode, wait_s", [("callback_outlives_wait", "1"), ("peer_never_issues", "1"),
                                          ("queued_callbacks", "1"), ("in_flight", "0")])
def test_an_exit_that_outwaits_mccl_exit_wait_s_aborts_the_groups_and_exits_zero(mode, wait_s, monkeypatch):
    """What the exit's wait (MCCL_EXIT_WAIT_S) cannot finish is named on stderr, the process's
    groups are aborted (what is in flight fails at once), the callbacks are waited for, and every
    rank exits 0 soon after. Before, ``callback_outlives_wait`` and ``queued_callbacks`` aborted
    the process (exit -6: a callback woke, or torch dropped its wrapper, in a finalizing
    interpreter; 12 of 12 ranks for 40 queued 0.1 s callbacks), ``in_flight`` with a wait of 0 did
    on 10 of 16 ranks, and ``peer_never_issues`` waited out the all-reduce's 60 s timeout."""
    world = 2
    timed = 1 if mode == "callback_outlives_wait" else 0  # the rank whose exit is timed
    monkeypatch.setenv("MCCL_TEST_EXIT_MODE", mode)
    monkeypatch.setenv("MCCL_EXIT_WAIT_S", wait_s)
    procs, outs, exited = _exit_script(world, first=timed, then_set="test/rank0_gone")
    for r, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, f"rank {r} exited {p.returncode}:\n{out[-3000:]}"
        assert "LEAVING" in out and "terminate called" not in out, f"rank {r}:\n{out[-3000:]}"
    out = outs[timed]
    if mode != "in_flight":  # with a wait of 0 the all-reduce may have finished before the exit
        assert f"after {int(float(wait_s) * 1000)} ms (MCCL_EXIT_WAIT_S)" in out and "aborting this process's " \
            "process groups" in out, out[-3000:]
    if mode == "callback_outlives_wait":  # its all-reduce was done: the callback ran to its end
        assert "(1 of them in their Future callbacks)" in out and "CALLBACK" in out, out[-3000:]
    if mode == "peer_never_issues":  # the all-reduce failed: fut.value() raised in the callback
        assert "1 operation(s) it issued are unfinished (0 of them" in out and "CALLBACK" not in out, out[-3000:]
    if mode == "queued_callbacks":  # every callback ran, after the abort too (on failed all-reduces)
        assert out.count("CALLBACK") == 30, out[-3000:]
    if mode != "in_flight":
        left = float(out.split("LEAVING ")[1].split()[0])
        # the wait, the callbacks (3 s; 30 x 0.1 s) and the interpreter's exit; before: -6 or 60 s
        assert exited - left < 8, f"rank {timed} exited {exited - left:.1f} s after its main code ended:\n{out[-3000:]}"


@pytest.mark.parametrize("value", ["abc", "-1", "nan"])
def test_a_bad_mccl_exit_wait_s_is_named_at_import(value):
    import subprocess

    env = dict(os.environ, MCCL_EXIT_WAIT_S=value)
    proc = subprocess.run([sys.executable, "-c", "import mccl"], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and f"MCCL_EXIT_WAIT_S must be a number of seconds from 0 to 86400, got {value!r}" \
        in proc.stderr, proc.stderr[-2000:]
