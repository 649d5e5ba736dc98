"""Command line of ``mccl-check`` (also ``python -m mccl.check``).

``MODEL`` is ``module:attribute``: a callable returning an ``nn.Module`` (called with
``--model-kwargs``, a JSON object) or an ``nn.Module`` instance. The current directory is importable.
Inputs are seeded standard-normal float tensors of the ``--input-shape`` shapes (repeat the option
for a model taking several inputs), or whatever ``--input-factory module:fn`` returns when called as
``fn(*shapes)`` (a tensor or a tuple of tensors). ``--seed`` seeds torch's global RNG before the
factory runs (reproducible initial weights) as well as the inputs and upstream gradients.

Exit status: 0 when nothing is flagged, 1 when anything is flagged or failed on the target, 2 on
usage errors (bad options, a model that cannot be imported or built, an absent device, a model that
fails on the reference with the inputs given).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any, List, Optional, Sequence

import torch
from rich.console import Console
from rich.text import Text
from torch import nn

from .compare import Thresholds, default_thresholds, default_whole_model_thresholds
from .. import _cli
from .layers import CheckUsageError, check_model, resolve_device
from .stft import DEFAULT_STFT_CONFIGS, DEFAULT_STFT_LENGTHS, StftConfig, check_stft, stft_dtype

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16, "half": torch.float16, "float64": torch.float64}


def _ints(text: str) -> List[int]:
    """``"2,1,76800"`` (or ``2x1x76800``) -> ``[2, 1, 76800]``."""
    try:
        values = [int(v) for v in text.replace("x", ",").split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def load_object(spec: str) -> Any:
    """Import ``module:attribute.path`` and return the attribute."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise CheckUsageError(f"{spec!r} is not of the form module:attribute")
    try:
        obj = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise CheckUsageError(f"cannot load {spec!r}: {type(exc).__name__}: {exc}") from exc
    return obj


def build_model(spec: str, kwargs: dict) -> nn.Module:
    """The ``nn.Module`` that ``spec`` names, built with ``kwargs`` when it is a factory."""
    obj = load_object(spec)
    if not isinstance(obj, nn.Module):
        if not callable(obj):
            raise CheckUsageError(f"{spec!r} is neither an nn.Module nor a callable returning one")
        try:
            obj = obj(**kwargs)
        except Exception as exc:
            raise CheckUsageError(f"building {spec!r} raised {type(exc).__name__}: {exc}") from exc
    elif kwargs:
        raise CheckUsageError(f"{spec!r} is a module instance; --model-kwargs needs a factory")
    if not isinstance(obj, nn.Module):
        raise CheckUsageError(f"{spec!r} returned {type(obj).__name__}, not an nn.Module")
    return obj


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mccl-check",
        description="Compare each layer's forward and backward on a device/dtype against CPU float64, "
                    "and torch.stft/istft against a float64 numpy reference.")
    p.add_argument("model", nargs="?", metavar="MODEL",
                   help="module:factory returning an nn.Module (or module:instance)")
    p.add_argument("--model-kwargs", type=json.loads, default={}, metavar="JSON",
                   help='keyword arguments for the factory, e.g. \'{"channels": 4}\'')
    p.add_argument("--input-shape", type=_ints, action="append", default=[], metavar="SHAPE",
                   help="shape of one model input, e.g. 2,1,76800 (repeat for several inputs)")
    p.add_argument("--input-factory", metavar="MODULE:FN", help="fn(*shapes) returning the model's inputs")
    p.add_argument("--device", default="cpu", help="target device: cpu, cuda, cuda:1, mps (default cpu)")
    p.add_argument("--dtype", default="float32", choices=sorted(DTYPES), help="target dtype (default float32)")
    p.add_argument("--cos", type=float, metavar="MIN",
                   help="minimum cosine similarity (default 0.99)")
    p.add_argument("--rel", type=float, metavar="MAX",
                   help="maximum relative error (default 1e-3 for float32, 5e-2 bfloat16, 1e-2 float16)")
    p.add_argument("--whole-cos", type=float, metavar="MIN",
                   help="minimum cosine similarity for the whole-model comparison (default 0.99)")
    p.add_argument("--whole-rel", type=float, metavar="MAX",
                   help="maximum relative error for the whole-model comparison (default 10x --rel's default)")
    p.add_argument("--json", metavar="PATH", type=_cli.output_file, help="write the full report as JSON")
    p.add_argument("--stft", action="store_true", help="also run the STFT reference check")
    p.add_argument("--stft-lengths", type=_ints, default=list(DEFAULT_STFT_LENGTHS), metavar="L,...",
                   help="signal lengths for --stft in samples (default 48000,76800,131071)")
    p.add_argument("--stft-ffts", type=_ints, default=[c.n_fft for c in DEFAULT_STFT_CONFIGS], metavar="N,...",
                   help="FFT sizes for --stft, hop N/4 and window N (default 512,1024,2048)")
    p.add_argument("--whole-model", action="store_true",
                   help="also compare the whole model end to end (automatic when a layer is not isolatable)")
    p.add_argument("--max-calls", type=int, metavar="N", help="check at most N calls of each module")
    p.add_argument("--recording-mb", type=float, default=1024.0, metavar="MB",
                   help="most recorded float64 activations held at once (default 1024)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of torch's RNG before the factory runs, of the inputs and of the upstream gradients "
                        "(default 0)")
    p.add_argument("--allow-tf32", action="store_true", help="keep TF32 for CUDA float32 (off by default)")
    p.add_argument("--only-flagged", action="store_true", help="table rows for flagged layers only")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _thresholds(base: Thresholds, cos: Optional[float], rel: Optional[float]) -> Thresholds:
    return Thresholds(base.cos_min if cos is None else cos, base.rel_max if rel is None else rel)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status."""
    p = parser()
    args = p.parse_args(argv)
    if not args.model and not args.stft:
        p.error("give a MODEL, --stft, or both")
    if args.model and not args.input_shape and not args.input_factory:
        p.error("give --input-shape (or --input-factory) for the model")
    if not isinstance(args.model_kwargs, dict):
        p.error("--model-kwargs must be a JSON object")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    dtype = DTYPES[args.dtype]
    err = Console(stderr=True)
    progress = not args.no_progress and err.is_terminal
    try:
        device = resolve_device(args.device)
        report = None
        if args.model:
            torch.manual_seed(args.seed)
            model = build_model(args.model, args.model_kwargs)
            factory = load_object(args.input_factory) if args.input_factory else None
            report = check_model(model, input_shapes=args.input_shape, input_factory=factory, device=device,
                                 dtype=dtype, thresholds=_thresholds(default_thresholds(dtype), args.cos, args.rel),
                                 whole_model_thresholds=_thresholds(default_whole_model_thresholds(dtype),
                                                                    args.whole_cos, args.whole_rel),
                                 seed=args.seed,
                                 whole_model=args.whole_model, max_calls_per_module=args.max_calls,
                                 recording_budget_mb=args.recording_mb,
                                 allow_tf32=args.allow_tf32, progress=progress)
        if args.stft:
            configs = [StftConfig(n, n // 4, n) for n in args.stft_ffts]
            stft_report = check_stft(device=device, dtype=dtype, configs=configs, lengths=args.stft_lengths,
                                     thresholds=_thresholds(default_thresholds(stft_dtype(dtype)), args.cos, args.rel),
                                     seed=args.seed,
                                     progress=progress)
            if report is None:
                report = stft_report
            else:
                report.stft = stft_report.stft
                report.messages += stft_report.messages
                report.seconds += stft_report.seconds
    except CheckUsageError as exc:
        err.print(Text.assemble(("mccl-check: error: ", "bold red"), str(exc)))
        return 2
    out = Console(width=None if Console().is_terminal else 200)
    report.print(out, only_failed=args.only_flagged)
    if args.json:
        report.write_json(args.json)
    return 1 if report.flagged else 0


if __name__ == "__main__":
    sys.exit(main())
