"""An audio model for ``mccl-check``: 1-D convolutions, reflect padding, GroupNorm, attention and a
multi-resolution STFT loss, plus an optional injected device fault to see a flagged report.

``audio_model()`` returns the training objective ``loss(autoencoder(x), x)`` for a waveform batch
``x`` of shape ``(B, 1, L)`` (float, samples), so the check covers the loss's backward too::

    python -m mccl.check mccl.check.example:audio_model --input-shape 2,1,76800 --stft

The autoencoder follows the SEANet/DAC layout: a reflect-padded input convolution, encoder blocks of
residual units (dilated reflect-padded convolutions, GroupNorm, GELU) with strided downsampling
(strides 2, 4, 5, 8: 320x), multi-head self-attention at the bottleneck, and a mirrored decoder with
transposed convolutions and skip connections. With ``channels=32`` it has about 10.2M parameters.
Signals of 2,048 samples or more work (the deepest dilated convolution reflect-pads by 27 at 1/40
of the rate, and the 2048-point STFT by 1,024).

``fault`` injects a simulated device kernel bug into the input padding layer ``model.pad_in``. Like
a real one it shows up only off the reference path (any dtype but float64), and only for signals
whose length is above 2^16 and not a multiple of 2^16: sample indices at or beyond 2^16 wrap around
as a 16-bit index would. ``"backward"``: the forward is correct, but the gradient for input sample
``i >= 65536`` is the one for sample ``i - 65536``. ``"forward"``: output sample ``i >= 65536`` is
output sample ``i - 65536``.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from torch import nn

#: Index at which the simulated kernel's 16-bit sample index wraps.
WRAP = 2 ** 16
#: Multi-resolution STFT loss settings (n_fft, hop, window), hop = n_fft / 4.
RESOLUTIONS = ((512, 128, 512), (1024, 256, 1024), (2048, 512, 2048))


def _fault_active(x: torch.Tensor) -> bool:
    """The simulated bug's trigger: off float64, length > 2^16 and not a multiple of 2^16."""
    length = x.shape[-1]
    return x.dtype != torch.float64 and length > WRAP and length % WRAP != 0


class ReflectPadWrappingGrad(torch.autograd.Function):
    """Reflect padding whose backward wraps sample indices at 2^16 when :func:`_fault_active`."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: torch.Tensor, padding: int) -> torch.Tensor:
        ctx.padding, ctx.length, ctx.faulty = padding, x.shape[-1], _fault_active(x)
        return F.pad(x, (padding, padding), mode="reflect")

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor) -> Tuple[torch.Tensor, None]:
        p, length = ctx.padding, ctx.length
        gx = grad[..., p:p + length].clone()
        gx[..., 1:p + 1] += grad[..., :p].flip(-1)
        gx[..., length - 1 - p:length - 1] += grad[..., p + length:].flip(-1)
        if ctx.faulty:
            gx[..., WRAP:] = gx[..., :length - WRAP].clone()
        return gx, None


class FaultyReflectionPad1d(nn.Module):
    """``nn.ReflectionPad1d(padding)`` with the simulated 2^16 fault in its ``fault`` pass."""

    def __init__(self, padding: int, fault: str) -> None:
        super().__init__()
        if fault not in ("forward", "backward"):
            raise ValueError(f"fault must be 'forward' or 'backward', not {fault!r}")
        self.padding, self.fault = padding, fault

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fault == "backward":
            return ReflectPadWrappingGrad.apply(x, self.padding)
        y = F.pad(x, (self.padding, self.padding), mode="reflect")
        if _fault_active(x):
            y = torch.cat([y[..., :WRAP], y[..., :y.shape[-1] - WRAP]], dim=-1)
        return y


class ResidualUnit(nn.Module):
    """``x + conv1x1(gelu(groupnorm(conv7_dilated_reflect(x))))``; shape ``(B, C, T)`` kept."""

    def __init__(self, channels: int, dilation: int, groups: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(channels, channels, 7, dilation=dilation, padding=3 * dilation, padding_mode="reflect")
        self.norm = nn.GroupNorm(groups, channels)
        self.act = nn.GELU()
        self.conv2 = nn.Conv1d(channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act(self.norm(self.conv1(x))))


class EncoderBlock(nn.Module):
    """Residual units (one per dilation) then a strided convolution: ``(B, C, T) -> (B, 2C, ~T/s)``."""

    def __init__(self, channels: int, stride: int, groups: int, dilations: Sequence[int]) -> None:
        super().__init__()
        self.res = nn.Sequential(*(ResidualUnit(channels, d, groups) for d in dilations))
        self.norm = nn.GroupNorm(groups, channels)
        self.act = nn.GELU()
        self.down = nn.Conv1d(channels, 2 * channels, 2 * stride, stride=stride, padding=stride // 2,
                              padding_mode="reflect")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.norm(self.res(x))))


class DecoderBlock(nn.Module):
    """Transposed convolution ``(B, 2C, T') -> (B, C, >= T)``, cropped to the skip's length ``T``,
    plus the skip, then residual units."""

    def __init__(self, channels: int, stride: int, groups: int, dilations: Sequence[int]) -> None:
        super().__init__()
        self.up = nn.ConvTranspose1d(2 * channels, channels, 2 * stride, stride=stride)
        self.res = nn.Sequential(*(ResidualUnit(channels, d, groups) for d in dilations))
        self.norm = nn.GroupNorm(groups, channels)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        x = self.up(x)[..., :skip.shape[-1]] + skip
        return self.act(self.norm(self.res(x)))


class AttentionBlock(nn.Module):
    """Pre-norm multi-head self-attention over time with a residual: shape ``(B, C, T)`` kept."""

    def __init__(self, channels: int, heads: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(1, channels)
        self.attn = nn.MultiheadAttention(channels, heads, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x).transpose(1, 2)
        a, _ = self.attn(h, h, h, need_weights=False)
        return x + a.transpose(1, 2)


class AudioAutoencoder(nn.Module):
    """Waveform to waveform, ``(B, 1, L) -> (B, 1, L)``; see the module docstring."""

    def __init__(self, channels: int = 32, strides: Sequence[int] = (2, 4, 5, 8), dilations: Sequence[int] = (1, 3, 9),
                 groups: int = 4, heads: int = 8, fault: Optional[str] = None) -> None:
        super().__init__()
        self.pad_in = FaultyReflectionPad1d(3, fault) if fault else nn.ReflectionPad1d(3)
        self.conv_in = nn.Conv1d(1, channels, 7)
        widths = [channels * 2 ** i for i in range(len(strides) + 1)]
        self.encoder = nn.ModuleList(EncoderBlock(c, s, groups, dilations) for c, s in zip(widths, strides))
        self.bottleneck = AttentionBlock(widths[-1], heads)
        self.decoder = nn.ModuleList(DecoderBlock(c, s, groups, dilations)
                                     for c, s in reversed(list(zip(widths, strides))))
        self.pad_out = nn.ReflectionPad1d(3)
        self.conv_out = nn.Conv1d(channels, 1, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_in(self.pad_in(x))
        skips: List[torch.Tensor] = []
        for block in self.encoder:
            skips.append(h)
            h = block(h)
        h = self.bottleneck(h)
        for block in self.decoder:
            h = block(h, skips.pop())
        return self.conv_out(self.pad_out(h))


class MultiResolutionSTFTLoss(nn.Module):
    """Mean over resolutions of spectral convergence ``||S_y - S_x||_F / ||S_x||_F`` plus
    ``mean |log S_y - log S_x|``, with ``S = sqrt(max(|stft|^2, eps))`` of centered,
    reflect-padded, Hann-windowed STFTs. Inputs ``(B, 1, L)`` or ``(B, L)``; returns a scalar.
    16-bit inputs are promoted to float32 for the FFT, as mixed-precision training does.

    ``eps`` (power floor, default 1e-5) also bounds the conditioning of ``d log S = dS / S``:
    float32 rounding in a bin's power is about ``1e-7`` of its frame's energy, so bins far below
    the frame's level carry large relative errors into the gradient. With the common floor 1e-7,
    the float32 gradient of this loss for one of eight random initialisations of the small
    configuration was 1.4e-3 away from float64 (flagged); with 1e-5 it stays below 5e-4.
    """

    def __init__(self, resolutions: Sequence[Tuple[int, int, int]] = RESOLUTIONS, eps: float = 1e-5) -> None:
        super().__init__()
        self.resolutions, self.eps = tuple(resolutions), eps
        for i, (_, _, win) in enumerate(self.resolutions):
            self.register_buffer(f"window{i}", torch.hann_window(win), persistent=False)

    def _magnitude(self, x: torch.Tensor, i: int) -> torch.Tensor:
        n_fft, hop, win = self.resolutions[i]
        spec = torch.stft(x, n_fft, hop, win, window=getattr(self, f"window{i}").to(x.dtype), center=True,
                          pad_mode="reflect", return_complex=True)
        return torch.sqrt(torch.clamp(spec.real ** 2 + spec.imag ** 2, min=self.eps))

    def forward(self, prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        y, x = prediction.flatten(0, -2), target.flatten(0, -2)
        if y.dtype in (torch.float16, torch.bfloat16):
            y, x = y.float(), x.float()
        total = y.new_zeros(())
        for i in range(len(self.resolutions)):
            sy, sx = self._magnitude(y, i), self._magnitude(x, i)
            total = total + torch.linalg.norm(sy - sx) / torch.linalg.norm(sx)
            total = total + (torch.log(sy) - torch.log(sx)).abs().mean()
        return total / len(self.resolutions)


class AudioTrainingObjective(nn.Module):
    """``loss(model(x), x)``: what a training step differentiates, as one module to check."""

    def __init__(self, model: nn.Module, loss: nn.Module) -> None:
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.loss(self.model(x), x)


def audio_model(channels: int = 32, strides: Sequence[int] = (2, 4, 5, 8), dilations: Sequence[int] = (1, 3, 9),
                groups: int = 4, heads: int = 8, fault: Optional[str] = None) -> AudioTrainingObjective:
    """The example training objective: autoencoder plus multi-resolution STFT loss.

    ``channels`` is the width at full rate (doubled at each of the ``strides``), ``dilations`` one
    residual unit each per block, ``groups`` the GroupNorm groups, ``heads`` the attention heads
    (must divide ``channels * 2**len(strides)``). Defaults give about 10.2M parameters;
    ``channels=4, strides=(4, 8), dilations=(1,), heads=4`` a small, fast one. ``fault`` is ``None``,
    ``"forward"`` or ``"backward"`` (module docstring)."""
    return AudioTrainingObjective(AudioAutoencoder(channels, strides, dilations, groups, heads, fault),
                                  MultiResolutionSTFTLoss())
