"""Comparing a device result against its float64 reference: metrics, thresholds and the verdict.

Every comparison is made on the CPU in float64. Complex tensors are compared as real tensors with a
trailing dimension of 2 (real, imaginary), so their indices carry one more entry.

For a target tensor ``x`` and its reference ``r`` (same shape, ``n`` elements), over the positions
where both are finite:

* cosine similarity ``cos = <x, r> / (||x||_2 ||r||_2)`` (clipped to [-1, 1]); 1 when both are all
  zero, 0 when exactly one is;
* relative error ``rel = ||x - r||_2 / ||r||_2``; 0 when both are equal, inf when ``r`` is all zero
  and ``x`` is not;
* ``rms(t) = ||t||_2 / sqrt(n)``;
* elementwise error ``e_i = |x_i - r_i|``; ``e_i = inf`` where exactly one side is not finite or
  they are different non-finite values (a NaN against a NaN, or an inf against the same inf,
  counts as equal);
* worst index: the multi-index of ``argmax_i e_i`` (first one on ties, row-major order; none when
  all ``e_i`` are 0);
* first bad index: the first multi-index in row-major order with ``e_i > rel_max * (|r_i| + s)``,
  where ``s`` is the scale the tensor is judged against (below). It localises a fault, such as the
  first sample of a wrong gradient; it does not decide the verdict.

Verdict. Tensors are compared in groups (a layer's outputs, its input gradients, and the gradients
of the parameters owned by one module). Let ``S`` be the largest ``rms(r)`` in the group. A tensor
whose reference is itself within the error budget, ``rms(r) <= rel_max * S``, is numerically zero
next to its group (for example the gradient of an attention key bias, zero in exact arithmetic): it
is judged by absolute error, flagged when ``rms(x - r) > rel_max * S``, and ``s = S``. Every other
tensor is judged by ``s = rms(r)`` and flagged when ``cos < cos_min`` or ``rel > rel_max``. A
tensor with non-finite values where the reference has finite ones (or the other way round) is
always flagged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple

import numpy as np
import torch

Index = Tuple[int, ...]


@dataclass(frozen=True)
class Thresholds:
    """Limits a comparison must meet: ``cos >= cos_min`` and ``rel <= rel_max``."""

    cos_min: float = 0.99
    rel_max: float = 1e-3

    def to_dict(self) -> dict:
        return {"cos_min": self.cos_min, "rel_max": self.rel_max}


#: Default thresholds per target dtype. float32 (and float64) get the issue's 0.99 / 1e-3.
#: The 16-bit formats round every stored result: bfloat16 keeps 8 significant bits (unit roundoff
#: 2^-8 = 3.9e-3, so one rounding alone gives a relative error near 2.3e-3 rms) and float16 keeps
#: 11 (4.9e-4). A layer chains several roundings, and attention's softmax backward cancels: on an
#: H200 in bfloat16 most layers of the example model sit at 2e-3 to 5e-3 and the query gradient
#: of nn.MultiheadAttention at 2.1e-2, hence 5e-2 for bfloat16 and, scaled by 2^-3, 1e-2 for
#: float16. Index and padding faults give errors of order 0.1 to 1.
DEFAULT_THRESHOLDS = {
    torch.float64: Thresholds(0.99, 1e-3),
    torch.float32: Thresholds(0.99, 1e-3),
    torch.float16: Thresholds(0.99, 1e-2),
    torch.bfloat16: Thresholds(0.99, 5e-2),
}


def default_thresholds(dtype: torch.dtype) -> Thresholds:
    """The documented default thresholds for a target dtype (float32's for unlisted ones)."""
    return DEFAULT_THRESHOLDS.get(dtype, DEFAULT_THRESHOLDS[torch.float32])


#: How much looser the whole-model comparison's default ``rel_max`` is than the per-layer one.
#: End to end, rounding accumulates over every layer and is amplified where gradients cancel
#: (normalisation layers): the float32 example model reaches 2.6e-3 with no fault.
WHOLE_MODEL_REL_FACTOR = 10.0


def default_whole_model_thresholds(dtype: torch.dtype) -> Thresholds:
    """Defaults for the end-to-end comparison: the per-layer ``cos_min`` and ten times the
    per-layer ``rel_max`` (float32 1e-2, float16 0.1, bfloat16 0.5)."""
    base = default_thresholds(dtype)
    return Thresholds(base.cos_min, base.rel_max * WHOLE_MODEL_REL_FACTOR)


@dataclass
class Comparison:
    """One target tensor against its reference.

    ``tensor`` names it (``output``, ``grad input[0]``, ``grad weight``...), ``shape`` is its shape
    as compared, ``cos``/``rel_err`` are defined in the module docstring (NaN/inf when undefined),
    ``worst_abs_err`` is ``max_i e_i``, ``bad_count`` counts elements over the elementwise
    tolerance, ``nonfinite`` counts positions where finiteness disagrees, ``judged`` is
    ``"relative"`` or ``"absolute"``, and ``note`` explains anything unusual.
    """

    tensor: str
    shape: Index
    cos: float
    rel_err: float
    worst_index: Optional[Index]
    worst_abs_err: float
    first_bad_index: Optional[Index]
    bad_count: int
    nonfinite: int
    judged: str
    flagged: bool
    note: str = ""

    def to_dict(self) -> dict:
        return {
            "tensor": self.tensor,
            "shape": list(self.shape),
            "cos": _json_float(self.cos),
            "rel_err": _json_float(self.rel_err),
            "worst_index": None if self.worst_index is None else list(self.worst_index),
            "worst_abs_err": _json_float(self.worst_abs_err),
            "first_bad_index": None if self.first_bad_index is None else list(self.first_bad_index),
            "bad_count": self.bad_count,
            "nonfinite": self.nonfinite,
            "judged": self.judged,
            "flagged": self.flagged,
            "note": self.note,
        }


def _json_float(value: float) -> Optional[float]:
    """JSON has no NaN or infinity: those become null."""
    return value if math.isfinite(value) else None


def as_float64(t: torch.Tensor) -> torch.Tensor:
    """A detached float64 CPU copy of ``t``; complex tensors become real with a trailing dim of 2."""
    t = t.detach()
    if t.is_complex():
        return torch.view_as_real(t.to("cpu", torch.complex128)).clone()
    return t.to("cpu", torch.float64)


def _rms(t: torch.Tensor) -> float:
    return torch.linalg.vector_norm(t).item() / math.sqrt(t.numel()) if t.numel() else 0.0


def _unravel(flat: int, shape: Index) -> Index:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def missing(tensor: str, shape: Index, note: str) -> Comparison:
    """A flagged comparison for a tensor that exists on one side only (say, a missing gradient)."""
    return Comparison(tensor, tuple(shape), math.nan, math.inf, None, math.inf, None, 0, 0, "relative", True, note)


def compare_group(pairs: Sequence[Tuple[str, torch.Tensor, torch.Tensor]], thresholds: Thresholds) -> list:
    """Compare each ``(name, target, reference)`` of one group and return their :class:`Comparison`.

    Target and reference may live on any device and dtype; both are converted to float64 on the
    CPU. The group's scale ``S`` (largest reference rms) decides which tensors are judged by
    absolute error, as the module docstring defines.
    """
    prepared = [(name, as_float64(x), as_float64(r)) for name, x, r in pairs]
    scale = max((_rms(r if _all_finite(r) else torch.where(torch.isfinite(r), r, 0.0)) for _, _, r in prepared),
                default=0.0)
    return [_judge(name, x, r, scale, thresholds) for name, x, r in prepared]


def _all_finite(t: torch.Tensor) -> bool:
    """No NaN or inf in ``t`` (float64), tested through its sum to avoid a full-size mask."""
    return bool(torch.isfinite(t.sum()))


def _judge(name: str, x: torch.Tensor, r: torch.Tensor, scale: float, th: Thresholds) -> Comparison:
    shape = tuple(r.shape)
    if tuple(x.shape) != shape:
        return missing(name, shape, f"target shape {tuple(x.shape)} differs from reference shape {shape}")
    n = max(r.numel(), 1)
    if _all_finite(x) and _all_finite(r):
        xz, rz, nonfinite = x, r, 0
        err = (x - r).abs_()
    else:
        both = torch.isfinite(r) & torch.isfinite(x)
        same_nonfinite = ~torch.isfinite(r) & ((x == r) | (torch.isnan(x) & torch.isnan(r)))
        xz, rz = torch.where(both, x, 0.0), torch.where(both, r, 0.0)
        err = torch.where(both | same_nonfinite, (xz - rz).abs(), math.inf)
        nonfinite = int((~(both | same_nonfinite)).sum())
    norm_x, norm_r = torch.linalg.vector_norm(xz).item(), torch.linalg.vector_norm(rz).item()
    norm_d = torch.linalg.vector_norm(err if not nonfinite else (xz - rz)).item()
    if norm_x == 0.0 and norm_r == 0.0:
        cos = 1.0
    elif norm_x == 0.0 or norm_r == 0.0:
        cos = 0.0
    else:
        cos = min(1.0, max(-1.0, torch.dot(xz.flatten(), rz.flatten()).item() / (norm_x * norm_r)))
    rel = 0.0 if norm_d == 0.0 else (norm_d / norm_r if norm_r > 0.0 else math.inf)

    rms_r = norm_r / math.sqrt(n)
    absolute = rms_r <= th.rel_max * scale
    s = scale if absolute else rms_r
    bad = err > rz.abs().mul_(th.rel_max).add_(th.rel_max * s)
    bad_count = int(bad.sum())
    first_bad = _unravel(int(bad.flatten().view(torch.uint8).argmax()), shape) if bad_count else None
    worst, worst_err = None, 0.0
    if r.numel():
        flat = int(err.flatten().argmax())
        worst_err = float(err.flatten()[flat])
        worst = _unravel(flat, shape) if worst_err > 0.0 else None

    if absolute:
        flagged = norm_d / math.sqrt(n) > th.rel_max * scale
    else:
        flagged = cos < th.cos_min or rel > th.rel_max
    notes = []
    if nonfinite:
        flagged = True
        notes.append(f"{nonfinite} position(s) where only one side is finite")
    if absolute:
        notes.append(f"reference is ~0 next to its group (rms {rms_r:.3g} vs {scale:.3g}): judged by absolute error")
    return Comparison(name, shape, cos, rel, worst, worst_err, first_bad, bad_count, nonfinite,
                      "absolute" if absolute else "relative", flagged, "; ".join(notes))


def flatten_tensors(obj: Any) -> list:
    """The tensors inside nested tuples, lists and dicts, depth first, in order."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for item in obj for t in flatten_tensors(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in flatten_tensors(item)]
    return []
