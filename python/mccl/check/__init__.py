"""``mccl-check``: catch silent device gradient bugs before a fleet trains on them.

Runs every layer of a model forward and backward on a target device and dtype (``cuda``, ``mps``,
or ``cpu`` in float32/bfloat16/float16) and on the CPU in float64, with identical weights, inputs
and upstream gradients, at production shapes, one layer at a time; compares outputs, input
gradients and parameter gradients; and flags any tensor whose cosine similarity falls below
``cos_min`` or whose relative error ``||x - ref||_2 / ||ref||_2`` exceeds ``rel_max``. A separate
STFT check compares ``torch.stft``/``istft`` (centered, reflect padding) forward and backward with an
independent numpy/scipy float64 reference at the multi-resolution STFT loss settings.

Command line (exit status 0: nothing flagged, 1: something flagged or failed on the target, 2: usage
error)::

    python -m mccl.check mccl.check.example:audio_model --input-shape 2,1,76800 --stft \\
        --device cuda --dtype bfloat16 --json report.json

Python::

    from mccl.check import check_model, check_stft
    report = check_model(model, input_shapes=[(2, 1, 76800)], device="cuda", dtype=torch.float32)
    report.print(); report.write_json("report.json"); assert not report.flagged

Thresholds (:data:`DEFAULT_THRESHOLDS`, each overridable): float32 and float64 ``cos >= 0.99,
rel <= 1e-3``; bfloat16 ``cos >= 0.99, rel <= 5e-2``; float16 ``cos >= 0.99, rel <= 1e-2``. The
whole-model comparison (``--whole-model``, and the fallback for layers that cannot run alone) allows
ten times the ``rel`` (:func:`default_whole_model_thresholds`): rounding accumulates end to end.

Where things are defined: the metrics, the worst and first bad index and the verdict in
:mod:`mccl.check.compare`; the per-layer method (reference copy, capture, which calls are units,
isolation and the whole-model fallback, memory) in :mod:`mccl.check.layers`; the STFT conventions
and their adjoints in :mod:`mccl.check.stft`; the command line in :mod:`mccl.check.__main__`;
an example audio model with an optional injected fault in :mod:`mccl.check.example`. The guide with
a worked example is ``docs/CHECK.md``.
"""
from .compare import DEFAULT_THRESHOLDS, Comparison, Thresholds, default_thresholds, default_whole_model_thresholds
from .layers import CheckUsageError, check_model, compare_module
from .report import LayerResult, Report
from .stft import DEFAULT_STFT_CONFIGS, DEFAULT_STFT_LENGTHS, StftConfig, check_stft

__all__ = [
    "DEFAULT_STFT_CONFIGS",
    "DEFAULT_STFT_LENGTHS",
    "DEFAULT_THRESHOLDS",
    "CheckUsageError",
    "Comparison",
    "LayerResult",
    "Report",
    "StftConfig",
    "Thresholds",
    "check_model",
    "check_stft",
    "compare_module",
    "default_thresholds",
    "default_whole_model_thresholds",
]
