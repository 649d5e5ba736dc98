"""Device tensors (CUDA; MPS on a Mac): exact collectives, the handoff's ordering, failures, mixed jobs.

Every test here needs the device it names and is skipped where it is absent (CI has neither).
Several ranks share one GPU (rank r uses cuda:r % device_count). What each test proves:

- the CPU suite's collectives, run unchanged with the device as torch's default device: every
  collective, dtype and op exact, and every rank's bytes equal;
- a burst of 640 asynchronous all-reduces per rank with the caching allocator churning between
  calls and no host synchronisation: every element exact, and memory the caller freed right after
  issuing is never written by the collective's copy-back (the paper's buffer-reuse race);
- issuing right after a long kernel that writes the input returns at once, wait() does not block
  the host, and a kernel queued after wait() sees the reduced values; with
  torch.cuda.set_sync_debug_mode("error") nothing in issue or wait synchronises;
- a peer killed, or abort(), while consumer waits are queued on the stream: every survivor raises
  within the timeout and a kernel queued after the wait still completes (the stream is released);
- a mixed job (CUDA and CPU ranks) trains DDP with parameters bitwise equal everywhere, and DDP
  over mccl matches DDP over gloo within 1e-5 after 10 steps.
"""
from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from distributed import check_ok, digest, notify, run_job, run_ranks

HAS_CUDA = torch.cuda.is_available()
HAS_MPS = torch.backends.mps.is_available()
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="no CUDA device")
DEVICE_TYPES = [pytest.param("cuda", marks=needs_cuda),
                pytest.param("mps", marks=pytest.mark.skipif(not HAS_MPS, reason="no MPS device"))]


def _device(kind: str, rank: int) -> torch.device:
    if kind == "cuda":
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device(kind)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


# ---- the CPU suite on the device ---------------------------------------------------------------

def _on_device(rank: int, world_size: int, kind: str, module: str, name: str):
    """Run CPU test function ``module.name`` with ``kind`` as torch's default device."""
    import importlib

    dev = _device(kind, rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    torch.set_default_device(dev)
    return getattr(importlib.import_module(module), name)(rank, world_size)


#: (module, function, world sizes, whether every rank returns the same value: digests of results
#: that all ranks share; _rest_of_surface returns each rank's own reduce-scatter block)
SUITE = [("test_collectives", "_all_collectives", (2, 4), True),
         ("test_collectives", "_rest_of_surface", (3,), False),
         ("test_collectives", "_strided_views", (2,), True), ("test_collectives", "_point_to_point", (3,), True),
         ("test_collectives", "_async_burst", (3,), True)]


@pytest.mark.parametrize("kind", DEVICE_TYPES)
@pytest.mark.parametrize("module,name,sizes,same", SUITE, ids=[s[1] for s in SUITE])
def test_cpu_suite_on_device(kind, module, name, sizes, same):
    for ws in sizes:
        values = check_ok(run_ranks(_on_device, ws, kind, module, name, deadline_s=300))
        if same:
            assert all(v == values[0] for v in values), f"{name} on {ws} ranks: results differ between ranks"


# ---- a race burst ------------------------------------------------------------------------------

def _race_burst(rank: int, world_size: int, kind: str) -> dict:
    """640 asynchronous all-reduces, allocator churn between them, no host sync until the end.

    Every fifth one is fire-and-forget: the caller drops both its tensor and the Work at once, so
    the memory goes back to the caching allocator as soon as the collective is done, maybe before
    its copy-back ran on the device. The tensors allocated afterwards hold a sentinel that such a
    late copy-back would overwrite (the paper's buffer-reuse race)."""
    dev = _device(kind, rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    gen = torch.Generator().manual_seed(1234 + rank)  # churn sizes differ per rank
    sizes = (1, 13, 4099, 70001)
    works, sentinels = [], []
    for i in range(640):
        n = sizes[i % 4]
        t = torch.full((n,), float(rank + i % 97), device=dev)  # written by a kernel
        w = dist.all_reduce(t, async_op=True)
        if i % 5 == 0:
            del t, w
        else:
            works.append((i, w, t))
        sentinels.append(torch.full((sizes[(i + 1) % 4],), -7.0, device=dev))
        junk = torch.empty(int(torch.randint(1, 300000, (1,), generator=gen)), device=dev).fill_(-1.0)
        del junk
    bad = 0
    for i, w, t in works:
        w.wait()
        want = float(sum(r + i % 97 for r in range(world_size)))
        bad += int((t != want).sum().item())
    wrong_sentinels = sum(int((s != -7.0).sum().item()) for s in sentinels)
    _sync(dev)
    return {"wrong": bad, "sentinels": wrong_sentinels,
            "digest": digest(torch.cat([t.reshape(-1).cpu() for _, _, t in works[:50]]))}


@pytest.mark.parametrize("kind", DEVICE_TYPES)
def test_race_burst_exact(kind):
    values = check_ok(run_ranks(_race_burst, 3, kind, deadline_s=300))
    assert [v["wrong"] for v in values] == [0, 0, 0], values
    assert [v["sentinels"] for v in values] == [0, 0, 0], "memory freed after issue was overwritten"
    assert len({v["digest"] for v in values}) == 1


# ---- no host stall -------------------------------------------------------------------------------

def _cycles_for_ms(ms: float) -> int:
    """torch.cuda._sleep cycles that take about ``ms`` on this GPU (measured with events)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    cycles = 10_000_000
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return int(cycles * ms / max(start.elapsed_time(end), 1e-3))


def _load_kernels(t: torch.Tensor) -> None:
    """Launch once every kernel the timed part launches after a wait(): the steady state.

    CUDA loads a kernel's module on its first launch (torch sets CUDA_MODULE_LOADING=LAZY), and
    that first cuLaunchKernel blocks the host until the context's queued work, stream waits on
    a collective included, has drained (H200, driver 580, 2026-12-02: 10.3 s, until the
    group's timeout, with a peer that never issues; docs/DEVICES.md, "First launch of a
    kernel"). The handoff promises no host stall in the steady state, where every kernel has
    run once."""
    _ = (t * 2, t + 1, (t == 1.0).all(), t.clone().fill_(0.0))


def _no_host_stall(rank: int, world_size: int) -> dict:
    dev = _device("cuda", rank)
    torch.cuda.set_device(dev)
    n = 1 << 20
    t = torch.zeros(n, device=dev)
    dist.all_reduce(t)  # warm up: contexts, streams, pinned pool
    _load_kernels(t)
    _sync(dev)
    cycles = _cycles_for_ms(300)
    dist.barrier()
    torch.cuda.set_sync_debug_mode("error")  # any synchronising CUDA call through torch raises
    torch.cuda._sleep(cycles)                 # a long kernel...
    t.fill_(float(rank + 1))                  # ...then the producer of the input
    t0 = time.perf_counter()
    w = dist.all_reduce(t, async_op=True)
    issue_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    w.wait()
    wait_ms = (time.perf_counter() - t0) * 1e3
    out = t * 2                               # a consumer kernel queued after wait()
    busy = not torch.cuda.current_stream().query()
    torch.cuda.set_sync_debug_mode(0)
    want = 2.0 * sum(r + 1 for r in range(world_size))
    ok = bool((out == want).all().item())
    # The Future orders its consumers too.
    t.fill_(float(rank))
    fut = dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0] + 1)
    fut_ok = bool((fut.wait() == float(sum(range(world_size))) + 1).all().item())
    return {"issue_ms": issue_ms, "wait_ms": wait_ms, "busy_after_wait": busy, "ok": ok, "future_ok": fut_ok}


@needs_cuda
def test_issue_and_wait_do_not_block_the_host():
    values = check_ok(run_ranks(_no_host_stall, 2, deadline_s=180))
    for r, v in enumerate(values):
        assert v["ok"] and v["future_ok"], f"rank {r}: wrong result {v}"
        assert v["issue_ms"] < 50, f"rank {r}: issuing behind a 300 ms kernel took {v['issue_ms']:.1f} ms"
        assert v["wait_ms"] < 50, f"rank {r}: wait() took {v['wait_ms']:.1f} ms (a host block?)"
        assert v["busy_after_wait"], f"rank {r}: the GPU was idle right after wait(): something synchronised"


# ---- failures release the streams ---------------------------------------------------------------

def _queued_then_lost(rank: int, world_size: int, how: str, warm: bool = True) -> dict:
    """Ranks 0..n-2 queue an all-reduce, a stream wait and a kernel after it; the last rank never
    issues (it is killed, or rank 0 aborts). The stream must be released and every survivor raise.
    Without ``warm``, the kernel after the wait is launched for the first time: its launch blocks
    the host until the stream wait is released (CUDA's lazy loading, see _load_kernels), so the
    rank says "queued" just before that launch, and the kill (or the abort) must release it."""
    from torch.distributed.distributed_c10d import _abort_process_group

    dev = _device("cuda", rank)
    torch.cuda.set_device(dev)
    x = torch.ones(1 << 16, device=dev)
    dist.all_reduce(x)
    if warm:
        _load_kernels(x)
    _sync(dev)
    if rank == world_size - 1:
        notify("ready")
        # Never issues: killed by the driver, or (abort) alive until rank 0 has aborted.
        time.sleep(3600 if how == "kill" else 8)
        return {}
    t0 = time.perf_counter()
    w = dist.all_reduce(x, async_op=True)
    w.wait()                   # a stream wait on the consumer ticket
    if not warm:
        notify("queued")       # the launch below blocks until the wait is released
    after = x + 1              # a kernel queued behind it
    if warm:
        notify("queued")
    if how == "abort":
        time.sleep(1.0)
        _abort_process_group()
    _sync(dev)                 # returns only once the engine released the stream
    released_s = time.perf_counter() - t0
    assert after.numel() == x.numel()
    error = ""
    try:
        if how == "abort":
            w.wait()
        else:
            dist.all_reduce(torch.ones(4, device=dev))
            _sync(dev)
    except Exception as exc:  # noqa: BLE001 (what it says is the test)
        error = f"{type(exc).__name__}: {exc}"
    return {"released_s": released_s, "error": error, "success": w.is_success()}


def _kill_last(job):
    job.wait_for("ready", [2], timeout=120)
    # Well inside the group's 20 s timeout: a rank whose issue or wait() blocked the host is still
    # blocked when this gives up, and its stacks are printed (a host block is what this catches).
    job.wait_for("queued", [0, 1], timeout=12)
    time.sleep(0.5)
    job.signal(2)


@needs_cuda
@pytest.mark.parametrize("warm", [True, False], ids=["kernels-loaded", "first-launch"])
def test_peer_killed_releases_streams_and_every_survivor_raises(warm):
    results, _ = run_job(_queued_then_lost, 3, "kill", warm, pg_timeout_s=20, deadline_s=150, driver=_kill_last)
    for r in (0, 1):
        assert results[r].ok, results[r].error
        v = results[r].value
        assert v["released_s"] < 25, f"rank {r}: the stream was released after {v['released_s']:.1f} s"
        assert not v["success"], f"rank {r}: the lost all-reduce reported success"
        assert "Error" in v["error"] and "rank" in v["error"], f"rank {r}: {v['error']!r}"


@needs_cuda
def test_abort_releases_streams():
    results, _ = run_job(_queued_then_lost, 2, "abort", pg_timeout_s=60, deadline_s=150,
                         driver=lambda job: job.wait_for("queued", [0], timeout=120))
    assert results[0].ok, results[0].error
    v = results[0].value
    assert v["released_s"] < 11, f"abort released the stream after {v['released_s']:.1f} s"
    assert not v["success"] and "abort" in v["error"].lower(), v


# ---- mixed jobs and DDP --------------------------------------------------------------------------

def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 8))


def _train(model, dev, rank, steps, group=None, lr=2.0 ** -4):
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)  # a power-of-two step: p - lr*g is one rounding
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gen).to(dev)
        y = torch.randn(16, 8, generator=gen).to(dev)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    _sync(dev)
    return [p.detach().cpu() for p in model.parameters()]


def _mixed(rank: int, world_size: int) -> dict:
    """Ranks 0 and 1 hold CUDA tensors, 2 and 3 CPU tensors, in one group."""
    dev = _device("cuda", rank) if rank < 2 else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    t = torch.arange(70001, dtype=torch.float32, device=dev) + rank
    dist.all_reduce(t)
    outs = [torch.empty(5, dtype=torch.int64, device=dev) for _ in range(world_size)]
    dist.all_gather(outs, torch.full((5,), rank, dtype=torch.int64, device=dev))
    b = torch.full((9,), float(rank), dtype=torch.bfloat16, device=dev)
    dist.broadcast(b, src=3)
    params = _train(_model().to(dev), dev, rank, steps=20)
    return {"allreduce": digest(t), "allgather": digest(torch.cat(outs)), "broadcast": digest(b),
            "params": digest(torch.cat([p.reshape(-1) for p in params])),
            "exact": bool(torch.equal(t.cpu(), torch.arange(70001, dtype=torch.float32) * 4 + 6))}


@needs_cuda
def test_mixed_cuda_and_cpu_ranks_bitwise_equal():
    values = check_ok(run_ranks(_mixed, 4, deadline_s=300))
    assert all(v["exact"] for v in values)
    for key in ("allreduce", "allgather", "broadcast", "params"):
        assert len({v[key] for v in values}) == 1, f"{key} differs between the CUDA and CPU ranks: {values}"


def _ddp_vs_gloo(rank: int, world_size: int) -> dict:
    dev = _device("cuda", rank)
    torch.cuda.set_device(dev)
    gloo = dist.new_group(backend="gloo")
    a = _train(_model().to(dev), dev, rank, steps=10, lr=0.05)
    b = _train(_model().to(dev), dev, rank, steps=10, lr=0.05, group=gloo)
    rel = max(float((x - y).norm() / y.norm()) for x, y in zip(a, b))
    return {"rel": rel, "params": digest(torch.cat([p.reshape(-1) for p in a]))}


@needs_cuda
def test_ddp_on_cuda_matches_gloo():
    values = check_ok(run_ranks(_ddp_vs_gloo, 2, deadline_s=300))
    assert all(v["rel"] <= 1e-5 for v in values), values
    assert values[0]["params"] == values[1]["params"]
