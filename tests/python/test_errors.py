"""Bad input and lost peers: a clear error on every rank, in time, and nothing sent by mistake."""
import os
import time

import pytest
import torch
import torch.distributed as dist

from distributed import check_ok, run_ranks


def _refuses(fn, *match):
    try:
        fn()
    except RuntimeError as exc:
        text = str(exc)
        assert all(m in text for m in match), f"error text {text!r} lacks {match}"
        return text
    raise AssertionError(f"expected an error mentioning {match}")


def _bad_arguments(rank: int, world_size: int) -> None:
    # Each call must fail on the caller's thread, before any byte is sent: the valid all_reduce
    # after each would otherwise see a peer's stray frame (a mismatch) or hang.
    ok = torch.ones(8)
    base = torch.zeros(3 * world_size)
    cases = [
        (lambda: dist.all_reduce(torch.ones(4).to(torch.float8_e4m3fn)), ("unsupported dtype", "Float8_e4m3fn")),
        (lambda: dist.all_reduce(torch.ones(1).expand(4)), ("share memory", "expand")),
        (lambda: dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG), ("avg", "bool")),
        (lambda: dist.all_reduce(torch.ones(4), op=dist.ReduceOp.BAND), ("band", "float32")),
        # torch's frontend skips meta tensors, so hand one to the backend object itself.
        (lambda: dist.group.WORLD._get_backend(torch.device("cpu")).allreduce([torch.ones(4, device="meta")]),
         ("device meta",)),
        # Sparse tensors: all_reduce takes them (test_surface.py), the other collectives do not.
        (lambda: dist.group.WORLD._get_backend(torch.device("cpu")).broadcast([torch.ones(4).to_sparse()]),
         ("strided",)),
        (lambda: dist.all_reduce(torch.ones(4).to_sparse(), op=dist.ReduceOp.MAX), ("sparse", "ReduceOp.MAX")),
        # Outputs may differ in size between ranks (test_surface.py), but this rank's must fit its input.
        (lambda: dist.all_gather([torch.ones(3)] * world_size, torch.ones(4)),
         ("all_gather", "this rank's", "input has 4")),
        (lambda: dist.all_gather_into_tensor(torch.ones(3), torch.ones(4)), ("expected world size",)),
        # Outputs of a list collective that share memory would each keep only the last copy.
        (lambda: dist.all_gather([torch.zeros(3)] * world_size, torch.ones(3)), ("outputs 0 and 1", "share memory")),
        (lambda: dist.all_gather([base[i:i + 3] for i in range(world_size)], torch.ones(3)),
         ("outputs 0 and 1", "share memory")),
        (lambda: dist.all_to_all([torch.zeros(1).expand(2)] * world_size, [torch.ones(2)] * world_size),
         ("all_to_all: output 0", "share memory")),
        # Strided views torch cannot judge: the same view made twice, and two that interleave badly.
        (lambda: dist.all_gather([base[::2] for _ in range(world_size)], torch.ones(base[::2].numel())),
         ("outputs 0 and 1", "share memory")),
        (lambda: dist.all_gather([base[2 * i:2 * i + 4:2] for i in range(world_size)], torch.ones(2)),
         ("outputs 0 and 1", "share memory")),
    ]
    for call, match in cases:
        _refuses(call, *match)
        dist.all_reduce(ok)
    assert torch.equal(ok, torch.full((8,), float(world_size) ** len(cases)))
    # Interleaved views share a storage but no element: they are fine.
    dist.all_gather([base[i::world_size] for i in range(world_size)], torch.full((3,), float(rank)))
    assert torch.equal(base[:3 * world_size], torch.arange(world_size, dtype=torch.float32).repeat(3)), base


def test_bad_arguments_raise_before_sending():
    check_ok(run_ranks(_bad_arguments, 2))


def _peer_exits(rank: int, world_size: int) -> dict:
    dist.barrier()
    if rank == world_size - 1:
        os._exit(0)  # disappear without destroying anything, mid-job
    start = time.monotonic()
    t = torch.ones(1 << 20)
    try:
        for _ in range(50):
            dist.all_reduce(t)
    except dist.DistBackendError as exc:
        return {"error": str(exc), "seconds": time.monotonic() - start}
    return {"error": None}


def test_lost_peer_is_named_on_every_rank_within_timeout():
    results = run_ranks(_peer_exits, 3, pg_timeout_s=20, deadline_s=90)
    survivors = [r for r in results if r.rank != 2]
    values = check_ok(survivors)
    for r, v in zip(survivors, values):
        assert v["error"] is not None, f"rank {r.rank} never noticed that rank 2 left"
        assert "rank 2" in v["error"], v["error"]
        assert v["seconds"] < 20, f"rank {r.rank} took {v['seconds']:.1f} s"


# ---- mismatched collectives: one rank issues a different size, dtype, op or kind -----------------

ODD = 2  # the rank that differs


def _mismatched_call(case: str, rank: int):
    """(output, inputs, call) for ``case`` on ``rank``; rank ODD is the one that differs."""
    odd = rank == ODD
    i32 = torch.int32
    if case in ("size", "size-ring"):
        n = 100 if case == "size" else 1 << 20
        t = torch.full((n + (n if odd else 0),), rank + 1, dtype=i32)
        return t, [], lambda: dist.all_reduce(t)
    if case == "dtype":  # the same bytes: 2048 int32 against 1024 int64
        t = torch.full((1024,), rank + 1, dtype=torch.int64) if odd else torch.full((2048,), rank + 1, dtype=i32)
        return t, [], lambda: dist.all_reduce(t)
    if case == "dtype-ring":  # the same count and bytes: int32 against float32
        t = torch.full((1 << 20,), rank + 1, dtype=torch.float32 if odd else i32)
        return t, [], lambda: dist.all_reduce(t)
    if case == "op":
        t = torch.full((100,), rank + 1, dtype=i32)
        return t, [], lambda: dist.all_reduce(t, op=dist.ReduceOp.MAX if odd else dist.ReduceOp.SUM)
    if case == "kind-broadcast":
        t = torch.full((100,), rank + 1, dtype=i32)
        return t, [], (lambda: dist.broadcast(t, 0)) if odd else (lambda: dist.all_reduce(t))
    if case == "kind-all_gather":  # the same output size
        t = torch.full((400,), rank + 1, dtype=i32)
        x = torch.full((100,), -rank, dtype=i32)
        return t, [x], (lambda: dist.all_gather_into_tensor(t, x)) if odd else (lambda: dist.all_reduce(t))
    if case == "kind-reduce_scatter":  # the same per-rank count
        if odd:
            out, x = torch.full((100,), -7, dtype=i32), torch.full((400,), rank + 1, dtype=i32)
            return out, [x], lambda: dist.reduce_scatter_tensor(out, x)
        out, x = torch.full((400,), -7, dtype=i32), torch.full((100,), rank + 1, dtype=i32)
        return out, [x], lambda: dist.all_gather_into_tensor(out, x)
    raise ValueError(case)


MISMATCHES = ["size", "size-ring", "dtype", "dtype-ring", "op", "kind-broadcast", "kind-all_gather",
              "kind-reduce_scatter"]


def _mismatched(rank: int, world_size: int, case: str) -> dict:
    out, inputs, call = _mismatched_call(case, rank)
    before, inputs_before = out.clone(), [x.clone() for x in inputs]
    try:
        call()
        error = ""
    except RuntimeError as exc:
        error = str(exc)
    start = time.monotonic()
    dist.destroy_process_group()
    return {"error": error, "destroy_s": time.monotonic() - start, "out_of_place": bool(inputs),
            "output_untouched": torch.equal(out, before),
            "inputs_untouched": all(torch.equal(x, b) for x, b in zip(inputs, inputs_before))}


@pytest.mark.parametrize("case", MISMATCHES)
def test_mismatched_collectives_fail_on_every_rank_and_touch_no_output(case):
    """Every rank raises an error saying mismatch (the ranks next to the odd one detect it, the
    others hear it from them), no rank wrote into its output or its inputs (outputs are written
    only once the collective is known to match everywhere), and the group can be destroyed."""
    values = check_ok(run_ranks(_mismatched, 4, case, pg_timeout_s=20, deadline_s=90, start_method="forkserver"))
    for rank, v in enumerate(values):
        assert v["error"], f"rank {rank} returned without an error"
        assert "mismatch" in v["error"], f"rank {rank}: {v['error']}"
        assert v["inputs_untouched"], f"rank {rank}: an input changed"
        assert v["output_untouched"], f"rank {rank} wrote into its output before learning of the mismatch"
        assert v["destroy_s"] < 10, f"rank {rank}: destroy took {v['destroy_s']:.1f} s"
    detected = [r for r, v in enumerate(values) if "failed: collective mismatch between ranks" in v["error"]]
    assert detected, "no rank reported the mismatch as its own finding"


def _float_kind_mismatch(rank: int, world_size: int, odd_kind: str) -> dict:
    """Rank 0 issues a float32 all-gather (or reduce-scatter) of 100 elements per rank where the
    others issue a reduce-scatter (all-gather): Bruck against folded doubling."""
    x = torch.full((100,), float(rank + 1))
    big = torch.full((100 * world_size,), -7.0)
    ag = (lambda: dist.all_gather_into_tensor(big, x))
    rs = (lambda: dist.reduce_scatter_tensor(x, big))
    call = (ag if odd_kind == "all_gather" else rs) if rank == 0 else (rs if odd_kind == "all_gather" else ag)
    start = time.monotonic()
    try:
        call()
        error = ""
    except RuntimeError as exc:
        error = str(exc)
    return {"error": error, "took_s": time.monotonic() - start}


@pytest.mark.parametrize("world_size", [3, 5])
@pytest.mark.parametrize("connect", ["eager", "runtime"])
def test_float_kind_mismatch_fails_at_once(world_size, connect):
    """A new user's report: on 3 or 5 ranks this waited out the group timeout on every rank, because
    the all-gather's only frame went to a link with nothing posted (parked unchecked), and with
    connections opened on first use to a higher rank that needed nothing from rank 0, so never
    dialled it (it is asked to now: csrc/transport/wire.h, MCCL_HELLO_KIND_ASK). Every rank must
    name the mismatch well inside the 20 s timeout."""
    env = {"MCCL_RUNTIME_CONNECT": "1" if connect == "runtime" else "0"}
    for odd_kind in ("all_gather", "reduce_scatter"):
        values = check_ok(run_ranks(_float_kind_mismatch, world_size, odd_kind, pg_timeout_s=20, deadline_s=90,
                                    start_method="forkserver", env=env))
        for rank, v in enumerate(values):
            assert "mismatch" in v["error"], f"{odd_kind} on rank 0, rank {rank}: {v['error']!r}"
            assert v["took_s"] < 5, f"{odd_kind} on rank 0, rank {rank}: took {v['took_s']:.1f} s"


def _mismatch_on_8(rank: int, world_size: int) -> str:
    t = torch.ones((1 << 20) + (1 if rank == ODD else 0))  # the pipelined ring
    try:
        dist.all_reduce(t)
    except RuntimeError as exc:
        return str(exc)
    return ""


def test_mismatch_is_named_on_every_rank_of_8():
    messages = check_ok(run_ranks(_mismatch_on_8, 8, pg_timeout_s=30, deadline_s=120, start_method="forkserver"))
    lost = {r: m[-150:] for r, m in enumerate(messages) if "mismatch" not in m}
    assert not lost, f"errors without the cause: {lost}"


def _skips_a_collective(rank: int, world_size: int) -> dict:
    """docs/FAILURES.md's case: rank 1 skips the first of two all-reduces of the same signature."""
    x = torch.full((1000,), 1.0)
    y = torch.full((1000,), 1000.0)
    try:
        if rank != 1:
            dist.all_reduce(x)  # the call site rank 1 skips
        dist.all_reduce(y)
        error = ""
    except RuntimeError as exc:
        error = str(exc)
    return {"error": error, "y": y[0].item(), "x": x[0].item()}


def _same_lines(rank: int, world_size: int) -> dict:
    """Collectives from the same lines on every rank: a loop, all_gather, a Future callback, DDP,
    DDP with PowerSGD."""
    t = torch.arange(6, dtype=torch.float64) + rank
    for _ in range(3):
        dist.all_reduce(t)
    gathered = [torch.zeros(6, dtype=torch.float64) for _ in range(world_size)]
    dist.all_gather(gathered, t)
    fut = dist.all_reduce(t, async_op=True).get_future()
    fut.then(lambda f: dist.broadcast(f.value()[0], src=0)).wait()
    # DDP: the broadcast at construction, then buckets issued during backward().
    torch.manual_seed(rank)  # different initial weights: DDP's broadcast must make them equal
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4, dtype=torch.float64),
                                                      bucket_cap_mb=0.0001)
    for step in range(2):
        model.zero_grad(set_to_none=True)
        x = torch.full((3, 8), float(rank + step), dtype=torch.float64)
        model(x).sum().backward()
    grads = [p.grad.tolist() for p in model.parameters()]
    # A communication hook defined in torch whose Future callbacks issue collectives (PowerSGD):
    # the callbacks run at then() on some ranks and on mccl's completion thread on others.
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    torch.manual_seed(0)
    hooked = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 8, dtype=torch.float64))
    hooked.register_comm_hook(psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                                 start_powerSGD_iter=2, use_error_feedback=False,
                                                 warm_start=False), psgd.powerSGD_hook)
    for step in range(5):
        hooked.zero_grad(set_to_none=True)
        hooked(torch.full((4, 16), float(rank + step), dtype=torch.float64)).sum().backward()
    return {"t": t.tolist(), "grads": grads, "powersgd": [p.grad.tolist() for p in hooked.parameters()]}


def test_a_skipped_collective_of_the_same_signature_fails_every_rank_with_call_sites_checked():
    """With MCCL_CHECK_CALL_SITES=1, rank 1's all_reduce(y) meets the others' all_reduce(x), whose
    sizes, dtype and op agree: every rank fails, each names the line it issued from, the ranks that
    compared the two name both call sites, and no rank returns a combination of x and y."""
    results = check_ok(run_ranks(_skips_a_collective, 4, pg_timeout_s=20, deadline_s=90, start_method="forkserver",
                                 env={"MCCL_CHECK_CALL_SITES": "1"}))
    for rank, v in enumerate(results):
        assert "mismatch" in v["error"] and "call site" in v["error"], f"rank {rank}: {v['error']!r}"
        assert "(issued at test_errors.py:" in v["error"], f"rank {rank} does not say where: {v['error']!r}"
        assert v["y"] == 1000.0, f"rank {rank}'s y was written: {v['y']}"
        if rank != 1:
            assert v["x"] == 1.0, f"rank {rank}'s x was written: {v['x']}"
    assert any("site differ" in v["error"] for v in results), "no rank compared the two call sites"


def test_collectives_from_the_same_lines_pass_with_call_sites_checked():
    """The check must not refuse a correct program: loops, all_gather, a collective issued from a
    Future's callback (mccl's order marks; it runs on another thread on some ranks), DDP's
    buckets and PowerSGD's (collectives from torch's own callbacks) are exact and equal on every
    rank."""
    results = check_ok(run_ranks(_same_lines, 3, pg_timeout_s=20, deadline_s=90, start_method="forkserver",
                                 env={"MCCL_CHECK_CALL_SITES": "1"}))
    for rank, values in enumerate(results):
        assert values == results[0], f"rank {rank}: {values} != rank 0's {results[0]}"
    base = [3.0 + 3 * i for i in range(6)]  # sum over 3 ranks of i + rank
    expected = [v * 3 ** 3 for v in base]  # three more all-reduces: x 3 each
    assert results[0]["t"] == expected, f"{results[0]['t']} != {expected}"
    # The last step's gradients, averaged over ranks: x = rank + 1 everywhere in row and column.
    bias, weight = results[0]["grads"][1], results[0]["grads"][0]
    assert bias == [3.0] * 4, bias  # 3 rows of ones per rank, averaged
    assert weight == [[3.0 * 2] * 8] * 4, weight  # 3 rows of (rank + 1), summed over rows, mean 2


def _group_with_timeout(rank: int, world_size: int, timeout) -> str:
    from datetime import timedelta
    try:
        dist.new_group(backend="mccl", timeout=timedelta(seconds=timeout))
    except ValueError as exc:
        return str(exc)
    return "created"


@pytest.mark.parametrize("timeout", [0, -5])
def test_a_group_timeout_of_zero_or_less_is_refused(timeout):
    """libmccl reads a timeout <= 0 as its 30-minute default: the group refuses it instead of
    silently waiting half an hour."""
    for v in check_ok(run_ranks(_group_with_timeout, 2, timeout, deadline_s=60)):
        assert "timeout must be positive" in v and "30 minutes" in v, v


def test_a_sub_millisecond_group_timeout_is_one_millisecond():
    """torch hands a group's timeout to libmccl in whole milliseconds: 0.5 ms would have become 0,
    libmccl's 30-minute default. (A whole group at 1 ms fails its init on this machine: the
    timeout bounds init too.)"""
    from datetime import timedelta

    import mccl

    assert mccl._group_timeout(timedelta(microseconds=500)) == timedelta(milliseconds=1)
    assert mccl._group_timeout(timedelta(microseconds=1)) == timedelta(milliseconds=1)
    assert mccl._group_timeout(timedelta(seconds=7)) == timedelta(seconds=7)
    for bad in (timedelta(0), timedelta(seconds=-1)):
        with pytest.raises(ValueError, match="timeout must be positive"):
            mccl._group_timeout(bad)


def _link_congestion(rank: int, world_size: int) -> list:
    """The TCP congestion control of each TCP socket this rank holds after an all-reduce."""
    import socket

    dist.all_reduce(torch.ones(4))
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6):
                names.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0")[0].decode())
        except OSError:
            pass
        finally:
            s.close()
    return names


@pytest.mark.skipif(not hasattr(__import__("socket"), "TCP_CONGESTION"), reason="TCP_CONGESTION is Linux's")
def test_mccl_tcp_congestion_sets_every_link_defaults_to_cubic_and_refuses_what_the_kernel_refuses():
    # reno is built into every Linux kernel and allowed to every process.
    for names in check_ok(run_ranks(_link_congestion, 3, env={"MCCL_TCP_CONGESTION": "reno"}, deadline_s=60)):
        # The links to the 2 peers, dialled and accepted (the store is a file here), and the
        # listener where it stays open (MCCL_RUNTIME_CONNECT=1).
        assert len(names) >= 2 and set(names) == {"reno"}, names
    # Unset: cubic where a socket may choose it (socket.h says why), else the system's default;
    # "system": the system's default. (On the machine this was written on the default is bbr.)
    import socket

    system = open("/proc/sys/net/ipv4/tcp_congestion_control").read().strip()
    probe = socket.socket()
    try:
        probe.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, b"cubic")
        default = "cubic"
    except OSError:
        default = system
    finally:
        probe.close()
    for env, want in (({}, default), ({"MCCL_TCP_CONGESTION": "system"}, system)):
        for names in check_ok(run_ranks(_link_congestion, 3, env=env, deadline_s=60)):
            assert len(names) >= 2 and set(names) == {want}, (env, names)
    results = run_ranks(_link_congestion, 2, env={"MCCL_TCP_CONGESTION": "no-such-cc"}, deadline_s=60, pg_timeout_s=20)
    for r in results:
        assert not r.ok and "MCCL_TCP_CONGESTION=no-such-cc: this system refuses it" in r.error, r.error
