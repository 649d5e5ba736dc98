"""Per-layer comparison of a model on a target device/dtype against CPU float64.

Method (see ``docs/CHECK.md`` for the worked example):

1. Reference copy. The model is deep-copied to CPU float64 in eval mode (dropout off, batch norm
   on running statistics); the caller's model is never modified. Every floating-point parameter and
   buffer of the copy, and every model input, is rounded through the target dtype (``float32``,
   ``bfloat16``...) and back, so the reference and the target start from bit-identical values and
   the comparison measures the target's arithmetic, not the rounding of weights and data.
2. Recording. A first forward pass of the reference copy under ``torch.no_grad``, with forward
   pre- and post-hooks on every module, lists the module calls, their nesting and the bytes of
   their floating-point arguments and outputs, at the production shapes given; nothing is kept.
   The units (below) are then recorded in consecutive windows of at most ``recording_budget_mb``:
   for each window the forward pass runs again until the window's last unit has returned, and the
   hooks keep clones of each unit's positional and keyword arguments and of its output. Clones are
   immune to later in-place ops (``ReLU(inplace=True)``, ``x += y`` in a parent).
3. Units. The calls checked are the leaves of the call tree (calls during which no other module was
   called; modules inside a ``torch.nn.utils.parametrize`` parametrization count as part of their
   owner) plus calls of modules that own parameters directly and also call submodules (their whole
   subtree is checked, so those parameters are covered). ``nn.MultiheadAttention`` is a leaf: its
   ``out_proj`` is used through ``F.multi_head_attention_forward``, not called. A module called
   several times (shared) is checked on every call, each labelled with its call number, unless
   ``max_calls_per_module`` limits it. Functional code between module calls (a residual ``+``) is
   covered only by the whole-model comparison.
4. Isolation. Each unit is first run alone on the recorded (unrounded) arguments; if that raises,
   or its output differs from the output recorded inside the model (relative 1e-9: it depends on
   state outside its arguments, such as context set by a parent or randomness), the unit is
   reported ``not isolatable`` with the reason, and the whole model is compared end to end instead.
5. Comparison, one unit at a time. The unit is deep-copied twice: float64 CPU and target
   device/dtype, with identical (rounded) weights. Floating-point arguments become leaves that
   require grad (float64 for the reference, the target dtype on the target) and the unit receives
   clones of them, so in-place ops work. Both run forward; a seeded standard-normal upstream
   gradient, rounded through the target output's dtype, is backpropagated through both; outputs,
   argument gradients and parameter gradients are compared (``compare.py`` defines the metrics and
   the verdict). Everything of the unit is freed before the next, so memory beyond the recorded
   activations is one unit's forward and backward on each side.

Memory: one window of recorded float64 arguments and outputs (``recording_budget_mb``, default
1 GiB; a single larger unit makes its own window), the activations a no-grad forward pass holds at
the point where it is stopped, the reference copy of the model, and one unit's forward and backward
on both sides. Time: one listing pass, plus about half a forward pass per window, plus the units.

On CUDA with float32 the check turns TF32 off for matmuls and convolutions while it runs (float32
means IEEE float32 against the float32 thresholds); ``allow_tf32=True`` keeps TF32 and then wants
a looser ``rel_max`` such as float16's 1e-2 (TF32 keeps 11 significant bits, as float16 does).
"""
from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from torch import nn
from torch.nn.utils.parametrize import ParametrizationList

from .compare import (Thresholds, compare_group, default_thresholds, default_whole_model_thresholds, flatten_tensors,
                      missing)
from .report import ERROR, NOT_ISOLATABLE, LayerResult, Report

#: Tolerance (relative, 2-norm, per output tensor) for a unit's output alone to equal its output
#: inside the model: both are float64 on the CPU, so any real difference is far above it.
ISOLATION_RTOL = 1e-9

Shape = Tuple[int, ...]
InputFactory = Callable[..., Union[torch.Tensor, Sequence[torch.Tensor]]]


class CheckUsageError(ValueError):
    """The check cannot start: unknown or absent device, no inputs, or a model that fails on the
    reference (CPU float64) with the inputs given (often a wrong input shape)."""


def resolve_device(device: Union[str, torch.device]) -> torch.device:
    """``torch.device(device)``, after making sure a tensor can be placed there."""
    try:
        dev = torch.device(device)
        torch.empty(1, device=dev)
    except (RuntimeError, AssertionError) as exc:
        raise CheckUsageError(f"device {str(device)!r} is not usable here: {exc}") from exc
    return dev


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).replace("torch.", "")


def _is_float(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def complex_of(dtype: torch.dtype) -> torch.dtype:
    """The complex dtype a real target dtype computes complex values in (no 16-bit complex here)."""
    return torch.complex128 if dtype == torch.float64 else torch.complex64


#: The real dtype whose precision a complex dtype stores its parts in.
_REAL_OF = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def rounded(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A detached CPU float64 (complex128) copy of ``t`` whose values are exact in ``dtype``."""
    t = t.detach()
    if t.is_complex():
        return t.to("cpu", complex_of(dtype)).to(torch.complex128)
    return t.to("cpu", dtype).to(torch.float64)


def _to_target(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return t.to(device, complex_of(dtype) if t.is_complex() else dtype)


def _tree_map(obj: Any, fn: Callable[[torch.Tensor, str], Any], path: str) -> Any:
    """Apply ``fn(tensor, path)`` to every tensor in nested tuples/lists/dicts; ``path`` names it
    like ``input[0][key]``. Other values are returned as they are."""
    if isinstance(obj, torch.Tensor):
        return fn(obj, path)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_tree_map(v, fn, f"{path}[{i}]") for i, v in enumerate(obj)))
    if isinstance(obj, (tuple, list)):
        return type(obj)(_tree_map(v, fn, f"{path}[{i}]") for i, v in enumerate(obj))
    if isinstance(obj, dict):
        return {k: _tree_map(v, fn, f"{path}[{k}]") for k, v in obj.items()}
    return obj


def _clone(t: torch.Tensor, _path: str = "") -> torch.Tensor:
    return t.detach().clone()


@contextmanager
def ieee_float32(device: torch.device, dtype: torch.dtype, allow_tf32: bool) -> Iterator[None]:
    """Within the block, CUDA float32 matmuls and convolutions run in IEEE float32 (no TF32),
    unless ``allow_tf32``; the previous settings are restored after."""
    if device.type != "cuda" or dtype != torch.float32 or allow_tf32:
        yield
        return
    matmul, conv = torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(matmul, "fp32_precision"):
        saved = (matmul.fp32_precision, conv.fp32_precision)
        matmul.fp32_precision, conv.fp32_precision = "ieee", "ieee"
        try:
            yield
        finally:
            matmul.fp32_precision, conv.fp32_precision = saved
    else:
        saved = (matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, False
        try:
            yield
        finally:
            matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@dataclass(eq=False)
class _Call:
    """One module call: where it sits in the call sequence, how many bytes its floating-point
    arguments and output take, and (once recorded) clones of its arguments and output."""

    name: str
    call: int
    module: nn.Module
    nested: bool = False
    nbytes: int = 0
    args: Any = None
    kwargs: Any = None
    output: Any = None

    @property
    def key(self) -> Tuple[str, int]:
        return self.name, self.call

    @property
    def label(self) -> str:
        return self.name if self.call == 1 else f"{self.name} (call {self.call})"


def _float_bytes(obj: Any) -> int:
    return sum(t.numel() * t.element_size() for t in flatten_tensors(obj) if _is_float(t))


class _Stop(BaseException):
    """Ends a recording pass once its last call is recorded (a BaseException, so that a model's
    own ``except Exception`` does not swallow it)."""


class _Recorder:
    """Forward hooks on every module of ``model``.

    With ``keep=None`` it lists every call (name, call number, nesting, bytes); with a set of call
    keys it clones those calls' arguments and outputs and stops the forward pass after the last.
    """

    def __init__(self, model: nn.Module, keep: Optional[frozenset]) -> None:
        self.calls: List[_Call] = []
        self.kept: Dict[Tuple[str, int], _Call] = {}
        self._stack: List[_Call] = []
        self._counts: Dict[str, int] = {}
        self._keep = keep
        inside_parametrization = {id(s) for m in model.modules() if isinstance(m, ParametrizationList)
                                  for s in m.modules()}
        self._handles = []
        for name, module in model.named_modules():
            if id(module) in inside_parametrization:
                continue
            name = name or "(model)"
            self._handles.append(module.register_forward_pre_hook(partial(self._pre, name), with_kwargs=True))
            self._handles.append(module.register_forward_hook(partial(self._post, name), with_kwargs=True))

    def _pre(self, name: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        count = self._counts.get(name, 0) + 1
        self._counts[name] = count
        call = _Call(name, count, module)
        if self._keep is None:
            call.nbytes = _float_bytes((args, kwargs))
            if self._stack:
                self._stack[-1].nested = True
            self.calls.append(call)
        elif call.key in self._keep:
            call.args, call.kwargs = _tree_map(args, _clone, ""), _tree_map(kwargs, _clone, "")
        self._stack.append(call)

    def _post(self, name: str, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        call = self._stack.pop()
        if self._keep is None:
            call.nbytes += _float_bytes(output)
        elif call.key in self._keep:
            call.output = _tree_map(output, _clone, "")
            self.kept[call.key] = call
            if len(self.kept) == len(self._keep):
                raise _Stop

    def run(self, model: nn.Module, inputs: tuple) -> None:
        """One forward pass under no_grad with the hooks; they are removed afterwards."""
        try:
            with torch.no_grad():
                model(*inputs)
        except _Stop:
            pass
        finally:
            for handle in self._handles:
                handle.remove()


def _is_unit(call: _Call) -> bool:
    return not call.nested or next(call.module.parameters(recurse=False), None) is not None


def _list_units(model: nn.Module, inputs: tuple, max_calls: Optional[int]) -> List[_Call]:
    """The units (module docstring) of one forward pass, in call order, not yet recorded."""
    recorder = _Recorder(model, None)
    try:
        recorder.run(model, inputs)
    except Exception as exc:
        raise CheckUsageError(f"the model fails on the reference (cpu float64) with inputs of shapes "
                              f"{[tuple(t.shape) for t in flatten_tensors(inputs)]}: "
                              f"{type(exc).__name__}: {exc}") from exc
    return [c for c in recorder.calls if _is_unit(c) and (max_calls is None or c.call <= max_calls)]


def _windows(units: List[_Call], budget_bytes: float) -> List[List[_Call]]:
    """Consecutive groups of units whose recorded bytes stay within ``budget_bytes`` (a unit
    larger than the budget gets a group of its own)."""
    windows: List[List[_Call]] = []
    used = 0
    for unit in units:
        if not windows or used + unit.nbytes > budget_bytes:
            windows.append([])
            used = 0
        windows[-1].append(unit)
        used += unit.nbytes
    return windows


def _record_window(model: nn.Module, inputs: tuple, window: List[_Call]) -> Tuple[Dict[Tuple[str, int], _Call], str]:
    """Re-run the forward pass until every unit of ``window`` has been recorded (clones); returns
    the recorded calls by key and, if the pass failed this time, why."""
    recorder = _Recorder(model, frozenset(u.key for u in window))
    try:
        recorder.run(model, inputs)
    except Exception as exc:
        return recorder.kept, f"re-running the forward pass raised {type(exc).__name__}: {exc}"
    return recorder.kept, ""


def _isolation_mismatch(alone: Any, inside: Any) -> str:
    """Why a unit's output run alone differs from its output inside the model ("" when equal
    within ``ISOLATION_RTOL`` in the 2-norm; NaN and inf must sit at the same places)."""
    a, b = flatten_tensors(alone), flatten_tensors(inside)
    if len(a) != len(b):
        return f"alone it returns {len(a)} tensors, inside the model {len(b)}"
    for x, y in zip(a, b):
        if x.shape != y.shape or x.dtype != y.dtype:
            return f"alone it returns shape {tuple(x.shape)} {x.dtype}, inside the model {tuple(y.shape)} {y.dtype}"
        if not _is_float(x):
            equal = torch.equal(x, y)
        elif bool(torch.isfinite(x.sum())) and bool(torch.isfinite(y.sum())):
            equal = torch.linalg.vector_norm(x - y).item() <= ISOLATION_RTOL * torch.linalg.vector_norm(y).item()
        else:
            equal = torch.allclose(x, y, rtol=ISOLATION_RTOL, atol=0.0, equal_nan=True)
        if not equal:
            return ("alone its output differs from its output inside the model: it depends on state outside "
                    "its arguments (context set by a parent, randomness)")
    return ""


def compare_module(source: nn.Module, args: tuple, kwargs: dict, *, device: torch.device, dtype: torch.dtype,
                   thresholds: Thresholds, seed: int, name: str, call: int = 1) -> LayerResult:
    """Run ``source`` (float64 CPU, weights already exact in ``dtype``) forward and backward on the
    CPU in float64 and on ``device``/``dtype`` with identical weights, arguments and upstream
    gradient, and compare outputs, argument gradients and parameter gradients."""
    result = LayerResult(name, type(source).__name__, call)
    ref_module = copy.deepcopy(source)
    try:
        tgt_module = copy.deepcopy(source).to(device=device, dtype=dtype)
    except Exception as exc:
        result.status = ERROR
        result.message = f"cannot be moved to {device} {dtype_name(dtype)}: {type(exc).__name__}: {exc}"
        return result
    ref_leaves: List[Tuple[str, torch.Tensor]] = []
    tgt_leaves: List[Tuple[str, torch.Tensor]] = []

    def ref_arg(t: torch.Tensor, path: str) -> torch.Tensor:
        if not _is_float(t):
            return t.cpu()
        leaf = rounded(t, dtype).requires_grad_(True)
        ref_leaves.append((path, leaf))
        return leaf.clone()

    def tgt_arg(t: torch.Tensor, path: str) -> torch.Tensor:
        if not _is_float(t):
            return t.to(device)
        leaf = _to_target(t.detach(), device, dtype).requires_grad_(True)
        tgt_leaves.append((path, leaf))
        return leaf.clone()

    side = "reference (cpu float64)"
    try:
        with torch.enable_grad():
            ref_out = ref_module(*_tree_map(args, ref_arg, "input"), **_tree_map(kwargs, ref_arg, "input"))
            side = f"{device} {dtype_name(dtype)}"
            tgt_out = tgt_module(*_tree_map(args, tgt_arg, "input"), **_tree_map(kwargs, tgt_arg, "input"))
    except Exception as exc:
        result.status, result.message = ERROR, f"forward failed on {side}: {type(exc).__name__}: {exc}"
        return result
    ref_outs = [t for t in flatten_tensors(ref_out) if _is_float(t)]
    tgt_outs = [t for t in flatten_tensors(tgt_out) if _is_float(t)]
    if len(ref_outs) != len(tgt_outs):
        result.status = ERROR
        result.message = f"{len(tgt_outs)} floating-point outputs on target, {len(ref_outs)} on reference"
        return result
    labels = ["output"] if len(ref_outs) == 1 else [f"output[{i}]" for i in range(len(ref_outs))]
    result.comparisons += compare_group(list(zip(labels, tgt_outs, ref_outs)), thresholds)

    generator = torch.Generator().manual_seed(seed)
    ref_grads, tgt_grads, ref_roots, tgt_roots = [], [], [], []
    for label, r, t in zip(labels, ref_outs, tgt_outs):
        if not r.requires_grad:
            continue
        if not t.requires_grad:
            result.comparisons.append(missing(f"grad of {label}", tuple(r.shape), "target output has no graph"))
            continue
        g = torch.randn(r.shape, generator=generator, dtype=torch.complex128 if r.is_complex() else torch.float64)
        g = rounded(g, _REAL_OF.get(t.dtype, t.dtype))
        ref_roots.append(r), ref_grads.append(g)
        tgt_roots.append(t), tgt_grads.append(g.to(t.device, t.dtype))
    if ref_roots:
        side = "reference (cpu float64)"
        try:
            torch.autograd.backward(ref_roots, ref_grads)
            side = f"{device} {dtype_name(dtype)}"
            torch.autograd.backward(tgt_roots, tgt_grads)
        except Exception as exc:
            result.status, result.message = ERROR, f"backward failed on {side}: {type(exc).__name__}: {exc}"
            return result

    pairs = []
    for (path, r), (_, t) in zip(ref_leaves, tgt_leaves):
        if r.grad is None and t.grad is None:
            continue
        if r.grad is None or t.grad is None:
            where = "target" if t.grad is None else "reference"
            result.comparisons.append(missing(f"grad {path}", tuple(r.shape), f"gradient missing on {where}"))
            continue
        pairs.append((f"grad {path}", t.grad, r.grad))
    result.comparisons += compare_group(pairs, thresholds)
    for (owner, ref_sub), (_, tgt_sub) in zip(ref_module.named_modules(), tgt_module.named_modules()):
        pairs = []
        for (pname, r), (_, t) in zip(ref_sub.named_parameters(recurse=False), tgt_sub.named_parameters(recurse=False)):
            label = f"grad {owner}.{pname}" if owner else f"grad {pname}"
            if not r.requires_grad or (r.grad is None and t.grad is None):
                continue
            if r.grad is None or t.grad is None:
                where = "target" if t.grad is None else "reference"
                result.comparisons.append(missing(label, tuple(r.shape), f"gradient missing on {where}"))
                continue
            pairs.append((label, t.grad, r.grad))
        result.comparisons += compare_group(pairs, thresholds)
    return result.settle()


def _check_unit(unit: _Call, *, device: torch.device, dtype: torch.dtype, thresholds: Thresholds,
                seed: int) -> LayerResult:
    """The isolation test of one unit, then :func:`compare_module` on it."""
    kind = type(unit.module).__name__
    try:
        alone_module = copy.deepcopy(unit.module)
        with torch.no_grad():
            alone = alone_module(*_tree_map(unit.args, _clone, ""), **_tree_map(unit.kwargs, _clone, ""))
    except Exception as exc:
        return LayerResult(unit.name, kind, unit.call, NOT_ISOLATABLE,
                           f"running it alone raised {type(exc).__name__}: {exc}")
    reason = _isolation_mismatch(alone, unit.output)
    if reason:
        return LayerResult(unit.name, kind, unit.call, NOT_ISOLATABLE, reason)
    return compare_module(unit.module, unit.args, unit.kwargs, device=device, dtype=dtype, thresholds=thresholds,
                          seed=seed, name=unit.name, call=unit.call)


def make_inputs(inputs: Union[torch.Tensor, Sequence[torch.Tensor], None], input_shapes: Optional[Sequence[Shape]],
                input_factory: Optional[InputFactory], seed: int) -> tuple:
    """The model's positional inputs: ``inputs`` as given, else ``input_factory(*input_shapes)``,
    else one seeded standard-normal float64 tensor per shape."""
    shapes = [tuple(int(d) for d in s) for s in (input_shapes or [])]
    if inputs is None and input_factory is not None:
        inputs = input_factory(*shapes)
    if inputs is None:
        if not shapes:
            raise CheckUsageError("give the model's inputs, their shapes, or an input factory")
        generator = torch.Generator().manual_seed(seed)
        inputs = tuple(torch.randn(s, generator=generator, dtype=torch.float64) for s in shapes)
    return (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)


def _reference_copy(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Deep copy on CPU in float64 and eval mode, floating tensors rounded through ``dtype``."""
    try:
        ref = copy.deepcopy(model).to(device="cpu", dtype=torch.float64).eval()
    except Exception as exc:
        raise CheckUsageError(f"the model cannot be copied to cpu float64: {type(exc).__name__}: {exc}") from exc
    with torch.no_grad():
        for t in list(ref.parameters()) + list(ref.buffers()):
            if _is_float(t):
                t.copy_(rounded(t, dtype))
    return ref


def check_model(model: nn.Module, inputs: Union[torch.Tensor, Sequence[torch.Tensor], None] = None, *,
                input_shapes: Optional[Sequence[Shape]] = None, input_factory: Optional[InputFactory] = None,
                device: Union[str, torch.device] = "cpu", dtype: torch.dtype = torch.float32,
                thresholds: Optional[Thresholds] = None, whole_model_thresholds: Optional[Thresholds] = None,
                seed: int = 0, whole_model: bool = False, max_calls_per_module: Optional[int] = None,
                recording_budget_mb: float = 1024.0, allow_tf32: bool = False, progress: bool = False) -> Report:
    """Compare every layer of ``model`` on ``device``/``dtype`` against CPU float64.

    ``inputs`` are the model's positional inputs (a tensor or a sequence of them); instead, give
    ``input_shapes`` (seeded standard-normal inputs, e.g. ``[(2, 1, 76800)]`` for batch 2, one
    channel, 76,800 samples) and optionally ``input_factory`` (called as
    ``input_factory(*input_shapes)``). ``thresholds`` default to :func:`default_thresholds` of
    ``dtype``. ``recording_budget_mb`` bounds the recorded activations held at once (module
    docstring). ``whole_model=True`` also compares the model end to end (done anyway when a layer
    is not isolatable), against ``whole_model_thresholds`` (default
    :func:`~mccl.check.compare.default_whole_model_thresholds`: rounding accumulates end to end).
    ``max_calls_per_module`` limits the calls checked per module, ``allow_tf32`` keeps TF32 on CUDA
    float32, ``progress`` shows a progress bar on stderr. Raises :class:`CheckUsageError` when the
    check cannot start; everything else, faults and non-isolatable layers included, ends up in the
    returned :class:`Report`.
    """
    start = time.perf_counter()
    dev = resolve_device(device)
    th = thresholds or default_thresholds(dtype)
    report = Report(str(dev), dtype_name(dtype), th)
    model_inputs = make_inputs(inputs, input_shapes, input_factory, seed)
    ref = _reference_copy(model, dtype)
    ref_inputs = _tree_map(model_inputs, lambda t, _: rounded(t, dtype) if _is_float(t) else t.cpu(), "input")
    with ieee_float32(dev, dtype, allow_tf32), progress_bar(progress) as bar:
        units = _list_units(ref, ref_inputs, max_calls_per_module)
        task = bar.add_task("layers", total=len(units))
        index = 0
        for window in _windows(units, recording_budget_mb * 2 ** 20):
            bar.update(task, description=f"recording {window[0].label} .. {window[-1].label}")
            recorded, failure = _record_window(ref, ref_inputs, window)
            for planned in window:
                bar.update(task, description=planned.label)
                t0 = time.perf_counter()
                unit = recorded.pop(planned.key, None)
                if unit is None:
                    result = LayerResult(planned.name, type(planned.module).__name__, planned.call, NOT_ISOLATABLE,
                                         failure or "the forward pass did not reach it again: it is not deterministic")
                else:
                    result = _check_unit(unit, device=dev, dtype=dtype, thresholds=th, seed=seed + 1 + index)
                result.seconds = time.perf_counter() - t0
                report.layers.append(result)
                index += 1
                del unit
                bar.advance(task)
        alone_failed = [r.label for r in report.layers if r.status == NOT_ISOLATABLE]
        if alone_failed:
            report.messages.append(f"{len(alone_failed)} layer(s) could not be run in isolation "
                                   f"({', '.join(alone_failed)}); "
                                   "compared the whole model end to end instead (outputs, input gradients and "
                                   "every parameter gradient)")
        if alone_failed or whole_model:
            bar.update(task, description="whole model")
            t0 = time.perf_counter()
            report.whole_model_thresholds = whole_model_thresholds or default_whole_model_thresholds(dtype)
            report.whole_model = compare_module(ref, ref_inputs, {}, device=dev, dtype=dtype,
                                                thresholds=report.whole_model_thresholds, seed=seed,
                                                name="(whole model)")
            report.whole_model.seconds = time.perf_counter() - t0
    report.seconds = time.perf_counter() - start
    return report


def progress_bar(enabled: bool) -> Progress:
    """A transient rich progress bar on stderr (inert when ``enabled`` is False)."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=Console(stderr=True), transient=True, disable=not enabled)
