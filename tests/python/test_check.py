"""mccl-check: healthy layers pass, an injected 2^16 fault is flagged by name and index, layers that
cannot run alone fall back to a whole-model comparison, and the STFT reference matches torch."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch import nn

from mccl.check import (CheckUsageError, StftConfig, Thresholds, check_model, check_stft,
                        default_thresholds)
from mccl.check import stft as stft_ref
from mccl.check.__main__ import main as cli_main
from mccl.check.compare import compare_group
from mccl.check.example import WRAP, ReflectPadWrappingGrad, audio_model
from mccl.check.report import NOT_ISOLATABLE

# The example model at test size: every layer type of the full one (reflect-padded and dilated
# convolutions, GroupNorm, GELU, strided and transposed convolutions, attention at the 320x
# bottleneck, the multi-resolution STFT loss) with 4 channels and two levels.
SMALL = dict(channels=4, strides=(8, 40), dilations=(3,), heads=4)


def _model(**kwargs) -> nn.Module:
    """The small example model with seeded weights."""
    torch.manual_seed(0)
    return audio_model(**SMALL, **kwargs)


@pytest.fixture(autouse=True)
def one_thread():
    """The tensors here are small: one intra-op thread is faster, and unaffected by a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _flagged(report):
    return {(r.label, c.tensor): c for r in report.results() for c in r.comparisons if c.flagged}


# ----------------------------------------------------------------------------------------------
# Metrics


def test_metrics_follow_their_definitions():
    th = Thresholds(0.99, 1e-3)
    r = torch.linspace(-1.0, 1.0, 101, dtype=torch.float64).reshape(1, 101)
    x = r.clone()
    x[0, 70] += 0.5
    (same,) = compare_group([("same", r.clone(), r)], th)
    assert (same.cos, same.rel_err, same.first_bad_index, same.flagged) == (1.0, 0.0, None, False)
    (c,) = compare_group([("bumped", x, r)], th)
    assert math.isclose(c.rel_err, 0.5 / r.norm().item())
    assert math.isclose(c.cos, torch.dot(x[0], r[0]).item() / (x.norm() * r.norm()).item())
    assert c.worst_index == (0, 70) and c.first_bad_index == (0, 70) and c.bad_count == 1 and c.flagged
    x[0, 3] = math.nan
    (nan,) = compare_group([("nan", x, r)], th)
    assert nan.flagged and nan.nonfinite == 1 and nan.first_bad_index == (0, 3)


def test_numerically_zero_tensor_is_judged_by_absolute_error():
    # A gradient that is zero in exact arithmetic (an attention key bias) next to a real one.
    th = Thresholds(0.99, 1e-3)
    big = torch.randn(64, dtype=torch.float64)
    tiny_ref, tiny_noise = torch.full((8,), 1e-17, dtype=torch.float64), torch.full((8,), 1e-8, dtype=torch.float64)
    real, zero = compare_group([("weight", big.float(), big), ("bias", tiny_noise, tiny_ref)], th)
    assert not real.flagged and real.judged == "relative"
    assert zero.judged == "absolute" and zero.rel_err > 1e6 and not zero.flagged
    (alone,) = compare_group([("bias", tiny_noise, tiny_ref)], th)
    assert alone.flagged, "without a group to compare against, the noise is a 1e9 relative error"


# ----------------------------------------------------------------------------------------------
# The example audio model on cpu float32 against float64


@pytest.mark.parametrize("length", [48_000, 76_800])
def test_healthy_audio_model_passes(length):
    report = check_model(_model(), input_shapes=[(2, 1, length)])
    assert not report.flagged, _flagged(report)
    kinds = {r.kind for r in report.layers}
    assert {"ReflectionPad1d", "Conv1d", "ConvTranspose1d", "GroupNorm", "GELU", "MultiheadAttention",
            "MultiResolutionSTFTLoss"} <= kinds
    assert report.whole_model is None and all(r.status == "ok" for r in report.layers)


def test_faulty_backward_is_flagged_by_name_at_its_first_bad_index():
    report = check_model(_model(fault="backward"), input_shapes=[(2, 1, 76_800)])
    assert [r.label for r in report.failed] == ["model.pad_in"], "no healthy layer may be flagged"
    flagged = _flagged(report)
    assert list(flagged) == [("model.pad_in", "grad input[0]")], "the forward is correct"
    grad = flagged["model.pad_in", "grad input[0]"]
    assert grad.first_bad_index == (0, 0, WRAP)
    assert grad.worst_index[-1] >= WRAP


@pytest.mark.parametrize("length", [48_000, 2 * WRAP])
def test_faulty_backward_is_silent_where_the_bug_is(length):
    # Below 2^16 there is no index to wrap; at a multiple of 2^16 the bug does not trigger.
    report = check_model(_model(fault="backward"), input_shapes=[(2, 1, length)])
    assert not report.flagged, _flagged(report)


def test_faulty_forward_is_flagged():
    report = check_model(_model(fault="forward"), input_shapes=[(2, 1, 76_800)])
    assert [r.label for r in report.failed] == ["model.pad_in"]
    output = _flagged(report)["model.pad_in", "output"]
    assert output.first_bad_index == (0, 0, WRAP)


def test_bfloat16_layers_pass_their_default_thresholds():
    """Healthy bf16 CPU kernels pass the bf16 defaults (the thresholds are not tighter than bf16
    arithmetic). oneDNN's strided bf16 Conv1d is wrong on AMX Xeons (docs/CHECK.md; the next test
    holds the check to that), so the kernels judged here are ATen's own."""
    with torch.backends.mkldnn.flags(enabled=False):
        report = check_model(_model(), input_shapes=[(2, 1, 48_000)], dtype=torch.bfloat16)
    assert report.thresholds == default_thresholds(torch.bfloat16) == Thresholds(0.99, 5e-2)
    assert not report.flagged, _flagged(report)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0))


def test_bfloat16_check_agrees_with_a_direct_comparison_of_the_onednn_convolutions():
    """With oneDNN on (torch's default), the check flags exactly the convolutions that a direct
    comparison with float64 shows this CPU's bf16 kernels to get wrong (on AMX Xeons, strided Conv1d
    and ConvTranspose1d: docs/CHECK.md), and nothing else."""
    import copy

    model = _model()
    wrong = set()
    gen = torch.Generator().manual_seed(0)
    for name, m in model.named_modules():
        if not isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)):
            continue
        x = torch.randn(2, m.in_channels, 150 if isinstance(m, nn.ConvTranspose1d) else 6000, generator=gen)
        outs = []
        for dtype in (torch.float64, torch.bfloat16):  # the output and the input's gradient
            xi = x.to(dtype).requires_grad_()
            y = copy.deepcopy(m).to(dtype)(xi)
            y.backward(torch.ones_like(y))
            outs.append((y.detach(), xi.grad))
        if min(_cos(outs[1][k], outs[0][k]) for k in (0, 1)) < 0.9:  # healthy bf16: cos > 0.999
            wrong.add(name)
    report = check_model(model, input_shapes=[(2, 1, 48_000)], dtype=torch.bfloat16)
    assert {label for label, _ in _flagged(report)} == wrong, wrong


# ----------------------------------------------------------------------------------------------
# Layers that cannot run alone


class _Gate(nn.Module):
    """Multiplies by ``sigmoid(weight * context)``; the parent sets ``context`` for one call only."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.weight[:, None] * self.context)


class _ContextModel(nn.Module):
    """In-place ops on recorded tensors, an in-place module, and a leaf that needs its parent."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 4, 5, padding=2, padding_mode="reflect")
        self.act = nn.ReLU(inplace=True)
        self.gate = _Gate(4)
        self.out = nn.Conv1d(4, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        h += 0.5
        h = self.act(h)
        self.gate.context = h.mean(dim=1, keepdim=True)
        try:
            h = self.gate(h)
        finally:
            del self.gate.context
        return self.out(h)


def test_layer_that_cannot_run_alone_falls_back_to_the_whole_model():
    torch.manual_seed(0)
    report = check_model(_ContextModel(), input_shapes=[(2, 1, 20_000)])
    status = {r.label: r for r in report.layers}
    assert status["gate"].status == NOT_ISOLATABLE and "AttributeError" in status["gate"].message
    assert all(status[name].status == "ok" for name in ("conv", "act", "out")), "in-place ops are recorded"
    assert any("could not be run in isolation" in m and "whole model" in m for m in report.messages)
    assert report.whole_model is not None and report.whole_model.status == "ok"
    tensors = {c.tensor for c in report.whole_model.comparisons}
    assert {"output", "grad input[0]", "grad gate.weight", "grad conv.weight"} <= tensors
    assert not report.flagged


class _SharedAndParametrized(nn.Module):
    """A weight-normed convolution (a parametrization) and one activation module called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(1, 4, 5, padding=2, padding_mode="reflect"))
        self.act = nn.GELU()
        self.out = nn.Conv1d(4, 1, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.out(self.act(self.conv(x))))


def test_parametrized_and_shared_modules():
    torch.manual_seed(0)
    report = check_model(_SharedAndParametrized(), input_shapes=[(2, 1, 5_000)])
    assert [r.label for r in report.layers] == ["conv", "act", "out", "act (call 2)"]
    conv = report.layers[0]
    assert {"grad parametrizations.weight.original0", "grad parametrizations.weight.original1"} <= {
        c.tensor for c in conv.comparisons}
    assert not report.flagged
    assert [r.label for r in check_model(_SharedAndParametrized(), input_shapes=[(2, 1, 5_000)],
                                         max_calls_per_module=1).layers] == ["conv", "act", "out"]


def test_usage_errors_raise():
    with pytest.raises(CheckUsageError, match="fails on the reference"):
        check_model(_model(), input_shapes=[(2, 3, 48_000)])
    with pytest.raises(CheckUsageError, match="not usable"):
        check_model(_model(), input_shapes=[(2, 1, 48_000)], device="nosuchdevice")
    with pytest.raises(CheckUsageError, match="inputs"):
        check_model(_model())


# ----------------------------------------------------------------------------------------------
# Command line


def _cli(*args, tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "mccl.check", *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240)


def test_cli_exit_status_and_json(tmp_path):
    small = json.dumps(SMALL)
    healthy = _cli("mccl.check.example:audio_model", "--model-kwargs", small, "--input-shape", "2,1,76800",
                   "--stft", "--stft-ffts", "512", "--stft-lengths", "76800", "--json", "ok.json", tmp_path=tmp_path)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "PASSED" in healthy.stdout
    ok = json.loads((tmp_path / "ok.json").read_text())
    assert ok["flagged"] is False and len(ok["stft"]) == 1 and ok["thresholds"] == {"cos_min": 0.99, "rel_max": 1e-3}

    faulty = _cli("mccl.check.example:audio_model", "--model-kwargs", json.dumps(dict(SMALL, fault="backward")),
                  "--input-shape", "2,1,76800", "--json", "bad.json", "--only-flagged", tmp_path=tmp_path)
    assert faulty.returncode == 1, faulty.stdout + faulty.stderr
    assert "model.pad_in" in faulty.stdout and "FLAGGED" in faulty.stdout
    bad = json.loads((tmp_path / "bad.json").read_text())
    assert bad["failed"] == ["model.pad_in"]
    (pad,) = [layer for layer in bad["layers"] if layer["name"] == "model.pad_in"]
    (grad,) = [c for c in pad["comparisons"] if c["flagged"]]
    assert grad["tensor"] == "grad input[0]" and grad["first_bad_index"] == [0, 0, WRAP]



def test_cli_usage_errors_exit_2(capsys):
    assert cli_main(["no_such_module:factory", "--input-shape", "2,1,100"]) == 2
    assert "cannot load" in capsys.readouterr().err
    assert cli_main(["mccl.check.example:audio_model", "--input-shape", "2,3,4096", "--no-progress"]) == 2
    assert "fails on the reference" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["mccl.check.example:audio_model"])
    assert exit_info.value.code == 2 and "--input-shape" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------
# STFT reference


@pytest.mark.parametrize("cfg", [StftConfig(512, 128, 512), StftConfig(1024, 256, 800)])
def test_numpy_reference_matches_torch_float64(cfg):
    # The reference is independent code (numpy padding and framing, scipy window and FFT): it must
    # agree with torch on the CPU in float64 to rounding, forward and adjoint, istft included.
    length = 5_001
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, length, dtype=torch.float64, generator=gen, requires_grad=True)
    window = torch.hann_window(cfg.win_length, dtype=torch.float64)
    kwargs = dict(n_fft=cfg.n_fft, hop_length=cfg.hop_length, win_length=cfg.win_length, window=window, center=True)
    spec = torch.stft(x, pad_mode="reflect", return_complex=True, **kwargs)
    ref = stft_ref.reference_stft(x.detach().numpy(), cfg)
    np.testing.assert_allclose(spec.detach().numpy(), ref, atol=1e-10 * np.abs(ref).max())
    g = torch.randn(spec.shape, dtype=torch.complex128, generator=gen)
    (g.real * spec.real + g.imag * spec.imag).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), stft_ref.reference_stft_adjoint(g.numpy(), length, cfg), atol=1e-9)
    spec_in = torch.from_numpy(ref).requires_grad_(True)
    y = torch.istft(spec_in, length=length, **kwargs)
    np.testing.assert_allclose(y.detach().numpy(), stft_ref.reference_istft(ref, length, cfg), atol=1e-10)
    u = torch.randn(2, length, dtype=torch.float64, generator=gen)
    (u * y).sum().backward()
    adjoint = stft_ref.reference_istft_adjoint(u.numpy(), spec.shape[-1], cfg)
    np.testing.assert_allclose(spec_in.grad.numpy(), adjoint, atol=1e-10)


def test_stft_check_passes_on_cpu_float32():
    report = check_stft()
    assert not report.flagged, _flagged(report)
    assert len(report.stft) == 9 and all(len(r.comparisons) == 5 for r in report.stft)
    assert max(c.rel_err for r in report.stft for c in r.comparisons) < 1e-5


_TORCH_STFT = torch.stft


def _stft_with_wrapping_pad_backward(x, n_fft, hop_length=None, win_length=None, window=None, center=True,
                                     pad_mode="reflect", normalized=False, onesided=None, return_complex=None):
    """torch.stft whose centered reflect padding has the simulated 2^16 backward fault."""
    padded = ReflectPadWrappingGrad.apply(x[:, None], n_fft // 2)[:, 0]
    return _TORCH_STFT(padded, n_fft, hop_length, win_length, window, center=False, normalized=normalized,
                       onesided=onesided, return_complex=return_complex)


def test_stft_check_catches_a_reflect_padding_backward_bug(monkeypatch):
    monkeypatch.setattr(torch, "stft", _stft_with_wrapping_pad_backward)
    report = check_stft(configs=[StftConfig(1024, 256, 1024)], lengths=[48_000, 76_800])
    assert [r.label for r in report.failed] == ["stft n_fft=1024 hop=256 win=1024 L=76800"]
    (grad,) = [c for c in report.failed[0].comparisons if c.flagged]
    assert grad.tensor.startswith("grad x") and grad.first_bad_index == (0, WRAP)


# ----------------------------------------------------------------------------------------------
# Accelerators, where present


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda(dtype):
    report = check_model(_model(), input_shapes=[(2, 1, 76_800)], device="cuda", dtype=dtype)
    assert not report.flagged, _flagged(report)
    assert not check_stft(device="cuda", dtype=dtype).flagged


@pytest.mark.skipif(not torch.backends.mps.is_available(), reason="no MPS device")
def test_mps():
    report = check_model(_model(), input_shapes=[(2, 1, 76_800)], device="mps")
    assert not report.flagged, _flagged(report)
    assert not check_stft(device="mps").flagged
