"""DDP's features over mccl against the same runs over gloo (issue 3, DDP acceptance).

Every variant below trains the same small model (with BatchNorm buffers, two heads) from the same
seed on rank-specific fixed data, once over mccl and once over gloo, for world sizes 2 and 3.
After the run, the parameters over mccl must equal gloo's within 1e-6 (relative to the largest
parameter) and every rank's parameters, buffers and last gradients must be bitwise equal.

All variants of one world size run inside one launch per backend (spawning ranks costs seconds on
a 2-core machine); a variant that raises reports its traceback instead of a value, and the test for
that variant fails with it.
"""
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from distributed import check_ok, digest, run_ranks

STEPS = 4
REL_TOL = 1e-6
# Compression hooks send fp16/bf16: the sum of 3 half-precision values is rounded once per hop, and
# gloo and mccl add in different orders, so their parameters may differ by rounding of the half
# type: the last gradients within one machine epsilon of the half type (one rounding), the
# parameters (moved by lr times the gradients) within a tenth of it, relative to the largest value.
HALF_EPS = {"fp16_hook": 2.0 ** -10, "fp16_builtin": 2.0 ** -10, "fp16_hook_grad_view": 2.0 ** -10,
            "bf16_hook": 2.0 ** -7}
GRAD_TOL = 1e-5
# join: a rank that ran out of data keeps the gradients of its own last step (DDP only syncs the
# parameters at the end), so last gradients are compared with gloo's rank by rank instead.
RANK_LOCAL_GRADS = {"join"}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16)  # running stats and an int64 counter: DDP broadcasts them
        self.fc2 = nn.Linear(16, 16)
        self.head_a = nn.Linear(16, 4)
        self.head_b = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, use_b: bool = True) -> torch.Tensor:
        h = F.relu(self.bn(self.fc1(x)))
        h = F.relu(self.fc2(h))
        out = self.head_a(h)
        if use_b:
            out = out + self.head_b(h)
        return out


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + 97 * rank + step)
    return torch.randn(12, 8, generator=g), torch.randn(12, 4, generator=g)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.detach().reshape(-1).to(torch.float64) for t in tensors]) if tensors else torch.zeros(0)


def _grads(model: nn.Module) -> torch.Tensor:
    return _flat([p.grad if p.grad is not None else torch.full_like(p, float("nan")) for p in model.parameters()])


def _step(model, opt, rank, step, use_b=True):
    x, y = _batch(rank, step)
    opt.zero_grad(set_to_none=False)
    F.mse_loss(model(x, use_b), y).backward()
    opt.step()


def _make(rank: int, **kwargs):
    torch.manual_seed(0)
    kwargs.setdefault("bucket_cap_mb", 0.001)  # several buckets, so several all-reduces per backward
    model = DDP(Net(), **kwargs)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def _finish(model: DDP, rank: int) -> dict:
    grads = _grads(model.module)
    model.eval()
    with torch.no_grad():  # an eval forward: DDP broadcasts buffers from rank 0 and BN keeps them
        model(_batch(rank, 99)[0])
    return {"params": _flat(list(model.module.parameters())), "buffers": _flat(list(model.module.buffers())),
            "grads": grads}


def v_plain(rank, ws):
    model, opt = _make(rank)
    for s in range(STEPS):
        _step(model, opt, rank, s)
    return _finish(model, rank)


def v_find_unused(rank, ws):
    # head_b is used on some ranks and not on others (rank-dependent graph) and on every rank in
    # some steps; DDP must all-reduce the "unused" bitmap and zero-fill the missing contributions.
    model, opt = _make(rank, find_unused_parameters=True)
    for s in range(STEPS):
        _step(model, opt, rank, s, use_b=((s + rank) % 2 == 0))
    return _finish(model, rank)


def v_static_graph(rank, ws):
    model, opt = _make(rank, static_graph=True)
    for s in range(STEPS):
        _step(model, opt, rank, s)
    return _finish(model, rank)


def v_grad_view(rank, ws):
    model, opt = _make(rank, gradient_as_bucket_view=True)
    for s in range(STEPS):
        _step(model, opt, rank, s)
    return _finish(model, rank)


def v_no_sync(rank, ws):
    # Two local micro-batches accumulate under no_sync(), the third synchronises all three.
    model, opt = _make(rank)
    for s in range(STEPS):
        opt.zero_grad()
        with model.no_sync():
            for m in range(2):
                x, y = _batch(rank, 10 * s + m)
                F.mse_loss(model(x), y).backward()
        x, y = _batch(rank, 10 * s + 2)
        F.mse_loss(model(x), y).backward()
        opt.step()
    return _finish(model, rank)


def _hooked(rank, ws, register, **kwargs):
    model, opt = _make(rank, **kwargs)
    register(model)
    for s in range(STEPS):
        _step(model, opt, rank, s)
    return _finish(model, rank)


def v_fp16_hook(rank, ws):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return _hooked(rank, ws, lambda m: m.register_comm_hook(None, default_hooks.fp16_compress_hook))


def bf16_hook(process_group, bucket):
    """torch's bf16_compress_hook, under another name: DDP refuses that name unless CUDA+NCCL or
    XPU+XCCL are present (a check in torch, not a property of the backend), so CPU users register
    exactly this."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)


def v_bf16_hook(rank, ws):
    return _hooked(rank, ws, lambda m: m.register_comm_hook(None, bf16_hook))


def v_fp16_builtin(rank, ws):
    return _hooked(rank, ws, lambda m: m._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS))


def v_fp16_hook_grad_view(rank, ws):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return _hooked(rank, ws, lambda m: m.register_comm_hook(None, default_hooks.fp16_compress_hook),
                   gradient_as_bucket_view=True)


def p_powersgd(rank, ws):
    # (batched_powerSGD_hook is not tested: in torch 2.13 it fails its own _orthogonalize assertion
    # on every backend, gloo included.)
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    def register(m):
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                   min_compression_rate=0.5, random_seed=7)
        m.register_comm_hook(state, psgd.powerSGD_hook)

    # One bucket: powerSGD_hook waits on a collective inside a Future callback, and with many
    # buckets in flight that exhausts gloo's two worker threads (gloo itself deadlocks there).
    return _hooked(rank, ws, register, bucket_cap_mb=25)


def p_powersgd_error_feedback_off(rank, ws):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    def register(m):
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=1,
                                   min_compression_rate=0.5, use_error_feedback=False, warm_start=False,
                                   random_seed=11)
        m.register_comm_hook(state, psgd.powerSGD_hook)

    return _hooked(rank, ws, register, bucket_cap_mb=25)


def v_join(rank, ws):
    # Uneven inputs: rank r has 3 + 2r batches; ranks that run out shadow the others' all-reduces.
    model, opt = _make(rank)
    steps = 0
    with model.join():
        for s in range(3 + 2 * rank):
            _step(model, opt, rank, s)
            steps += 1
    out = _finish(model, rank)
    out["steps"] = steps
    return out


def v_no_broadcast_buffers(rank, ws):
    model, opt = _make(rank, broadcast_buffers=False)
    for s in range(STEPS):
        _step(model, opt, rank, s)
    return _finish(model, rank)


# Two launches per backend and world size: PowerSGD chains collectives inside Future callbacks, so
# it runs apart from the rest and a failure there cannot take the other variants down with it.
GROUPS = {"core": {n[2:]: f for n, f in globals().items() if n.startswith("v_")},
          "powersgd": {n[2:]: f for n, f in globals().items() if n.startswith("p_")}}
VARIANTS = {name: group for group, fns in GROUPS.items() for name in fns}
# Variants whose buffers are not synchronised: BatchNorm statistics stay rank-local on purpose.
LOCAL_BUFFERS = {"no_broadcast_buffers"}


def _all_variants(rank: int, world_size: int, group: str) -> dict:
    out = {}
    for name, fn in GROUPS[group].items():
        try:
            out[name] = fn(rank, world_size)
        except Exception as exc:  # reported per variant; the test for it fails with this text
            out[name] = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
        dist.barrier()
    return out


_RUNS: dict = {}


def _runs(backend: str, world_size: int, group: str) -> list[dict]:
    key = (backend, world_size, group)
    if key not in _RUNS:
        try:
            _RUNS[key] = check_ok(run_ranks(_all_variants, world_size, group, backend=backend,
                                            deadline_s=90, pg_timeout_s=20))
        except AssertionError as exc:  # remembered, so the other variants fail fast with the same text
            _RUNS[key] = exc
    if isinstance(_RUNS[key], Exception):
        raise AssertionError(f"{backend} run of {group} at world size {world_size} failed:\n{_RUNS[key]}")
    return _RUNS[key]


def _variant(backend: str, world_size: int, name: str) -> list[dict]:
    per_rank = [r[name] for r in _runs(backend, world_size, VARIANTS[name])]
    errors = [f"rank {r}: {v['error']}" for r, v in enumerate(per_rank) if "error" in v]
    assert not errors, f"{name} over {backend}:\n" + "\n".join(errors)
    return per_rank


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("name", sorted(VARIANTS))
@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_variant_matches_gloo_and_ranks_agree(world_size, name):
    ours = _variant("mccl", world_size, name)
    gloo = _variant("gloo", world_size, name)
    for r in range(1, world_size):
        assert digest(ours[r]["params"]) == digest(ours[0]["params"]), f"rank {r}'s parameters differ bitwise"
        if name not in RANK_LOCAL_GRADS:
            assert digest(ours[r]["grads"]) == digest(ours[0]["grads"]), f"rank {r}'s last gradients differ bitwise"
        if name not in LOCAL_BUFFERS:
            assert digest(ours[r]["buffers"]) == digest(ours[0]["buffers"]), f"rank {r}'s buffers differ bitwise"
    assert not torch.isnan(ours[0]["grads"]).any(), "a parameter has no gradient after the last step"
    tol = 0.1 * HALF_EPS[name] if name in HALF_EPS else REL_TOL
    grad_tol = HALF_EPS.get(name, GRAD_TOL)
    rel = _rel(ours[0]["params"], gloo[0]["params"])
    assert rel <= tol, f"{name}: parameters differ from DDP over gloo by {rel:.3g} (relative; bound {tol:.3g})"
    for r in range(world_size):
        rel_g = _rel(ours[r]["grads"], gloo[r]["grads"])
        assert rel_g <= grad_tol, f"{name}: rank {r}'s last gradients differ from gloo's by {rel_g:.3g}"
    if name not in LOCAL_BUFFERS:
        rel_b = _rel(ours[0]["buffers"], gloo[0]["buffers"])
        assert rel_b <= tol, f"{name}: buffers differ from DDP over gloo by {rel_b:.3g} (relative)"
    # Training moved the parameters: the comparison is not between two untouched models.
    torch.manual_seed(0)
    initial = _flat(list(Net().parameters()))
    assert (ours[0]["params"] - initial).abs().max() > 1e-3


@pytest.mark.parametrize("world_size", [2, 3])
def test_join_ran_uneven_step_counts(world_size):
    ours = _variant("mccl", world_size, "join")
    assert [v["steps"] for v in ours] == [3 + 2 * r for r in range(world_size)]


@pytest.mark.parametrize("world_size", [2, 3])
def test_buffers_stay_local_without_broadcast_buffers(world_size):
    """The buffer check above can fail: without broadcast_buffers, the ranks' BN statistics differ."""
    ours = _variant("mccl", world_size, "no_broadcast_buffers")
    assert len({digest(v["buffers"]) for v in ours}) == world_size
    gloo = _variant("gloo", world_size, "no_broadcast_buffers")
    for r in range(world_size):
        assert _rel(ours[r]["buffers"], gloo[r]["buffers"]) <= REL_TOL


def _collective_in_future_callback(rank: int, world_size: int) -> torch.Tensor:
    """What PowerSGD does: a then() callback issues another collective and waits for it."""
    import time

    t = torch.full((4,), float(rank + 1))
    if rank == 1:
        time.sleep(1.0)  # rank 0's future is certainly still pending when then() is attached
    fut = dist.all_reduce(t, async_op=True).get_future()

    def chained(f):
        u = f.value()[0] * 10
        return dist.all_reduce(u, async_op=True).get_future().wait()[0]

    return fut.then(chained).wait()


@pytest.mark.parametrize("world_size", [2, 3])
def test_future_callback_can_issue_and_wait_on_a_collective(world_size):
    outs = check_ok(run_ranks(_collective_in_future_callback, world_size, deadline_s=60, pg_timeout_s=15))
    expected = torch.full((4,), 10.0 * world_size * sum(r + 1 for r in range(world_size)))
    for r, out in enumerate(outs):
        assert torch.equal(out, expected), f"rank {r}: {out}"


@pytest.mark.parametrize("world_size", [2, 3])
def test_fp16_hook_paths_agree_bitwise(world_size):
    """The Python fp16 hook, the same with bucket views, and the C++ FP16_COMPRESS built-in send
    the same fp16 bytes, so they train to the same bits."""
    runs = {n: _variant("mccl", world_size, n)[0] for n in ("fp16_hook", "fp16_hook_grad_view", "fp16_builtin")}
    assert digest(runs["fp16_hook_grad_view"]["params"]) == digest(runs["fp16_hook"]["params"])
    assert digest(runs["fp16_builtin"]["params"]) == digest(runs["fp16_hook"]["params"])
