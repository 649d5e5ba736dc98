"""STFT reference check: ``torch.stft``/``torch.istft`` on a device against a float64 numpy/scipy
reference, forward and backward, for the multi-resolution STFT loss settings audio models use.

Why: a centered ``torch.stft`` reflect-pads its input by ``n_fft // 2`` on both sides, and the
reflect-padding backward of one device backend returned wrong gradients for signals longer than
65,535 samples: training silently stopped improving. The check therefore covers signal lengths on
both sides of 2^16 (default 48,000, 76,800 and 131,071 samples).

Conventions, matching ``torch.stft(x, n_fft, hop_length, win_length, window=hann_window(win_length),
center=True, pad_mode="reflect", normalized=False, onesided=True, return_complex=True)`` for a
real signal ``x`` of shape ``(B, L)``:

* ``p = n_fft // 2``; ``xp`` is ``x`` reflect-padded by ``p`` on both sides (the edge sample is not
  repeated: ``xp[p - k] = x[k]``, ``xp[p + L - 1 + k] = x[L - 1 - k]``, ``k = 1..p``);
* ``w`` is the periodic Hann window of ``win_length`` samples (``scipy.signal.get_window("hann",
  win_length, fftbins=True)``), zero-padded to ``n_fft`` with ``(n_fft - win_length) // 2`` zeros
  on the left;
* ``T = 1 + L // hop`` frames; ``X[b, f, t] = sum_n w[n] xp[b, t*hop + n] exp(-2 pi i f n / n_fft)``
  for ``f = 0..n_fft//2``; shape ``(B, n_fft//2 + 1, T)``, complex.

Backward without finite differences. For a fixed seeded complex ``G`` of the shape of ``X``, the
scalar ``L_stft = sum Re(G * conj(X)) = sum(G.real * X.real + G.imag * X.imag)`` is linear in ``x``,
and its gradient is the adjoint STFT applied to ``G``:
``dL/dxp[t*hop + n] += w[n] * Re(sum_f G[f, t] exp(+2 pi i f n / n_fft))`` (an unnormalised inverse
DFT over the one-sided bins only), then folding the padding back:
``dL/dx[k] += dL/dxp[p - k]`` and ``dL/dx[L - 1 - k] += dL/dxp[p + L - 1 + k]`` for ``k = 1..p``.
Any STFT-based loss's gradient is this adjoint applied to its ``dLoss/dX``, so matching it for a
random ``G`` covers them all.

``istft`` (``center=True``, ``length=L``): frames ``irfft(X[:, :, t], n_fft) * w`` overlap-added at
``t*hop``, divided by the overlap-added ``w**2`` envelope, samples ``p .. p+L-1`` kept. For a fixed
real ``u`` of shape ``(B, L)`` and ``L_istft = sum(u * istft(X))``, the gradient (PyTorch's
convention for a complex leaf: ``dL/dRe X + i dL/dIm X``) is
``c_f / n_fft * rfft(w * frame_t(u / envelope))`` with ``c_f = 1`` for ``f = 0`` and ``n_fft/2``,
2 otherwise (``irfft`` ignores the imaginary parts of those two bins). The round trip
``istft(stft(x))`` is compared with ``x`` itself.

bfloat16 and float16: ``torch.stft`` has no bfloat16 kernel and float16 only for some sizes, and
audio losses compute spectra in float32, so for a 16-bit dtype the STFT check runs in float32 and
says so.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np
import scipy.fft
import scipy.signal
import torch

from .compare import Thresholds, compare_group, default_thresholds
from .layers import CheckUsageError, complex_of, dtype_name, progress_bar, resolve_device, rounded
from .report import ERROR, LayerResult, Report


@dataclass(frozen=True)
class StftConfig:
    """One STFT resolution: FFT size, hop and window length, in samples."""

    n_fft: int
    hop_length: int
    win_length: int

    @property
    def padding(self) -> int:
        return self.n_fft // 2

    def n_frames(self, length: int) -> int:
        """Frames of a centered STFT of ``length`` samples (``1 + length // hop`` for even n_fft)."""
        return 1 + (length + 2 * self.padding - self.n_fft) // self.hop_length

    @property
    def label(self) -> str:
        return f"stft n_fft={self.n_fft} hop={self.hop_length} win={self.win_length}"


#: The multi-resolution STFT loss settings of common audio models: FFT 512/1024/2048, hop 1/4.
DEFAULT_STFT_CONFIGS = (StftConfig(512, 128, 512), StftConfig(1024, 256, 1024), StftConfig(2048, 512, 2048))
#: Signal lengths in samples: below 2^16, above it, and above it by an odd amount.
DEFAULT_STFT_LENGTHS = (48_000, 76_800, 131_071)


def stft_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the STFT check runs in for a requested dtype (float32 for 16-bit types)."""
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def hann(cfg: StftConfig) -> np.ndarray:
    """Periodic Hann window, zero-padded (centered) to ``n_fft``; float64, shape ``(n_fft,)``."""
    w = np.zeros(cfg.n_fft)
    left = (cfg.n_fft - cfg.win_length) // 2
    w[left:left + cfg.win_length] = scipy.signal.get_window("hann", cfg.win_length, fftbins=True)
    return w


def _overlap_add(frames: np.ndarray, hop: int) -> np.ndarray:
    """Sum frames ``(B, T, N)`` placed at ``t*hop``: shape ``(B, N + hop*(T-1))``."""
    batch, n_frames, n = frames.shape
    out = np.zeros((batch, n + hop * (n_frames - 1)))
    for t in range(n_frames):
        out[:, t * hop:t * hop + n] += frames[:, t]
    return out


def _envelope(cfg: StftConfig, n_frames: int) -> np.ndarray:
    """Overlap-added squared window over the frames' span: shape ``(n_fft + hop*(n_frames-1),)``."""
    w = hann(cfg)
    return _overlap_add(np.broadcast_to(w * w, (1, n_frames, cfg.n_fft)), cfg.hop_length)[0]


def reference_stft(x: np.ndarray, cfg: StftConfig) -> np.ndarray:
    """STFT of real ``x`` ``(B, L)`` float64: complex128 ``(B, n_fft//2+1, 1 + L//hop)``."""
    xp = np.pad(x, ((0, 0), (cfg.padding, cfg.padding)), mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(xp, cfg.n_fft, axis=-1)[:, ::cfg.hop_length, :]
    return np.swapaxes(scipy.fft.rfft(frames * hann(cfg), axis=-1), -1, -2)


def reference_stft_adjoint(g: np.ndarray, length: int, cfg: StftConfig) -> np.ndarray:
    """Gradient of ``sum Re(g * conj(stft(x)))`` with respect to ``x`` (shape ``(B, length)``)."""
    p = cfg.padding
    full = np.zeros(g.shape[:1] + g.shape[2:] + (cfg.n_fft,), dtype=np.complex128)
    full[..., :g.shape[1]] = np.swapaxes(g, -1, -2)
    frames = np.real(scipy.fft.ifft(full, axis=-1)) * cfg.n_fft * hann(cfg)
    span = _overlap_add(frames, cfg.hop_length)
    gp = np.zeros((g.shape[0], length + 2 * p))
    gp[:, :span.shape[1]] = span
    gx = gp[:, p:p + length].copy()
    gx[:, 1:p + 1] += gp[:, p - 1::-1]
    gx[:, length - 1 - p:length - 1] += gp[:, p + length:][:, ::-1]
    return gx


def reference_istft(spec: np.ndarray, length: int, cfg: StftConfig) -> np.ndarray:
    """Inverse of :func:`reference_stft` for complex ``spec`` ``(B, F, T)``: float64 ``(B, length)``."""
    n_frames, p = spec.shape[-1], cfg.padding
    frames = scipy.fft.irfft(np.swapaxes(spec, -1, -2), n=cfg.n_fft, axis=-1) * hann(cfg)
    y = _overlap_add(frames, cfg.hop_length)
    return y[:, p:p + length] / _envelope(cfg, n_frames)[p:p + length]


def reference_istft_adjoint(u: np.ndarray, n_frames: int, cfg: StftConfig) -> np.ndarray:
    """Gradient of ``sum(u * istft(X))`` with respect to complex ``X`` (PyTorch's convention,
    ``dL/dRe X + i dL/dIm X``): complex128 ``(B, n_fft//2+1, n_frames)``."""
    p, hop, n = cfg.padding, cfg.hop_length, cfg.n_fft
    length = u.shape[-1]
    env = _envelope(cfg, n_frames)
    ue = np.zeros((u.shape[0], env.shape[0]))
    ue[:, p:p + length] = u / env[p:p + length]
    frames = np.stack([ue[:, t * hop:t * hop + n] for t in range(n_frames)], axis=1) * hann(cfg)
    c = np.full(n // 2 + 1, 2.0)
    c[0] = c[-1] = 1.0
    return np.swapaxes(scipy.fft.rfft(frames, axis=-1) * c / n, -1, -2)


def _check_one(cfg: StftConfig, length: int, *, batch: int, device: torch.device, dtype: torch.dtype,
               thresholds: Thresholds, seed: int) -> LayerResult:
    """Forward, backward and round trip of one resolution at one signal length."""
    result = LayerResult(f"{cfg.label} L={length}", "torch.stft")
    generator = torch.Generator().manual_seed(seed)
    complex_dtype = complex_of(dtype)
    x64 = rounded(torch.randn(batch, length, generator=generator, dtype=torch.float64), dtype)
    g64 = rounded(torch.randn(batch, cfg.n_fft // 2 + 1, cfg.n_frames(length), generator=generator,
                              dtype=torch.complex128), dtype)
    u64 = rounded(torch.randn(batch, length, generator=generator, dtype=torch.float64), dtype)
    ref_spec = torch.from_numpy(reference_stft(x64.numpy(), cfg))
    spec64 = rounded(ref_spec, dtype)
    kwargs = dict(n_fft=cfg.n_fft, hop_length=cfg.hop_length, win_length=cfg.win_length,
                  window=torch.hann_window(cfg.win_length, periodic=True, dtype=dtype, device=device),
                  center=True, normalized=False, onesided=True)
    try:
        x = x64.to(device, dtype).requires_grad_(True)
        spec = torch.stft(x, pad_mode="reflect", return_complex=True, **kwargs)
        g = g64.to(device, complex_dtype)
        (g.real * spec.real + g.imag * spec.imag).sum().backward()
        spec_in = spec64.to(device, complex_dtype).requires_grad_(True)
        y = torch.istft(spec_in, length=length, **kwargs)
        (y * u64.to(device, dtype)).sum().backward()
        with torch.no_grad():
            round_trip = torch.istft(spec.detach(), length=length, **kwargs)
    except Exception as exc:
        result.status, result.message = ERROR, f"failed on {device} {dtype_name(dtype)}: {type(exc).__name__}: {exc}"
        return result
    references = [
        ("stft(x)", spec, ref_spec),
        ("grad x of sum Re(G conj stft(x))", x.grad,
         torch.from_numpy(reference_stft_adjoint(g64.numpy(), length, cfg))),
        ("istft(X)", y, torch.from_numpy(reference_istft(spec64.numpy(), length, cfg))),
        ("grad X of sum(u istft(X))", spec_in.grad,
         torch.from_numpy(reference_istft_adjoint(u64.numpy(), cfg.n_frames(length), cfg))),
        ("istft(stft(x)) vs x", round_trip, x64),
    ]
    for name, target, reference in references:
        result.comparisons += compare_group([(name, target, reference)], thresholds)
    return result.settle()


def check_stft(*, device: Union[str, torch.device] = "cpu", dtype: torch.dtype = torch.float32,
               configs: Sequence[StftConfig] = DEFAULT_STFT_CONFIGS, lengths: Sequence[int] = DEFAULT_STFT_LENGTHS,
               batch: int = 2, thresholds: Optional[Thresholds] = None, seed: int = 0,
               progress: bool = False) -> Report:
    """Check ``torch.stft``/``istft`` on ``device`` against the float64 reference for every
    ``config`` and signal ``length`` (samples), with ``batch`` seeded standard-normal signals.

    16-bit dtypes run in float32 (:func:`stft_dtype`); ``thresholds`` default to that dtype's.
    Returns a :class:`Report` whose ``stft`` list holds one result per (config, length).
    """
    start = time.perf_counter()
    dev = resolve_device(device)
    run_dtype = stft_dtype(dtype)
    th = thresholds or default_thresholds(run_dtype)
    for cfg in configs:
        if not 0 < cfg.win_length <= cfg.n_fft or not 0 < cfg.hop_length <= cfg.padding:
            raise CheckUsageError(f"{cfg}: need 0 < win_length <= n_fft and 0 < hop_length <= n_fft // 2")
        for length in lengths:
            if length <= cfg.padding:
                raise CheckUsageError(f"length {length} must exceed n_fft // 2 = {cfg.padding} for reflect padding")
    report = Report(str(dev), dtype_name(run_dtype), th)
    if run_dtype != dtype:
        report.messages.append(f"torch.stft/istft lack {dtype_name(dtype)} FFT kernels (all sizes for bfloat16, "
                               f"non-powers of 2 for float16) and audio losses compute spectra in float32: the "
                               f"STFT check ran in {dtype_name(run_dtype)} "
                               f"(cos >= {th.cos_min}, rel <= {th.rel_max:g})")
    with progress_bar(progress) as bar:
        task = bar.add_task("stft", total=len(configs) * len(lengths))
        for i, cfg in enumerate(configs):
            for j, length in enumerate(lengths):
                bar.update(task, description=f"{cfg.label} L={length}")
                t0 = time.perf_counter()
                result = _check_one(cfg, length, batch=batch, device=dev, dtype=run_dtype, thresholds=th,
                                    seed=seed + i * len(lengths) + j)
                result.seconds = time.perf_counter() - t0
                report.stft.append(result)
                bar.advance(task)
    report.seconds = time.perf_counter() - start
    return report
