"""Token2wav's HiFT vocoder (mel -> 24 kHz wav) as one graph, STFT/ISTFT as convolutions.

Written from the official `HiFTGenerator` (stepaudio2 1.0.5, neural source filter + ISTFTNet) over
its parameters, weight norm folded (g v / ||v|| per output channel), never calling its forwards:
  * F0: five k=3 convs with ELU, a linear layer, |.|, per mel frame;
  * sine source (SineGen2): harmonics 1..9 of F0 as per-sample phase increments (F0 h / 24000 mod 1),
    accumulated per frame, scaled by 480 and linearly upsampled x480 (the official interpolate,
    written as a gather of the two neighbouring frames with constant weights), sin, x 0.1; voiced
    (F0 > 10 Hz) samples keep the sine plus 0.003 x noise, unvoiced ones get 0.1 / 3 x noise; a
    linear layer and tanh merge the 9 harmonics. The noise [1, samples, 9] is a graph input.
    SineGen2 also draws a random initial phase per harmonic, but adds it at sample 0 only, before
    a linear x1/480 resampling that reads samples 480 i + 239 and 480 i + 240: it never reaches the
    output, so it is not an input (the test checks the reference ignores it);
  * streaming state: `cache_source` [1, 1, 3840] (8 mel frames of source) replaces the head of the
    new source where `use_cache` is 1, as the official streaming call does with its cached source;
  * STFT (n_fft 16, hop 4, periodic Hann, centred with reflect padding) as a stride-4 conv with a
    [18, 1, 16] windowed DFT kernel; the upsampling / fusion / Snake resblock stack; conv_post ->
    exp(magnitude) (clipped at 100) and sin(phase); ISTFT as a stride-4 transposed conv with the
    windowed inverse real DFT kernel, divided by the overlap-added squared window, centre trimmed;
    clamp to +-0.99.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

HARMONICS = 9  # nb_harmonics 8 + the fundamental
SAMPLE_RATE = 24000
SINE_AMP, NOISE_STD, VOICED_THRESHOLD = 0.1, 0.003, 10.0
CACHE_FRAMES = 8  # the official streaming mel/source cache (160 ms)
LEAKY_SLOPE = 0.1  # lrelu_slope of the upsampling stack; the last leaky_relu uses torch's 0.01


def fold(module: nn.Module) -> torch.Tensor:
    """The effective weight of a (possibly weight-normed) conv: g * v / ||v|| over all but dim 0."""
    parametrizations = getattr(module, "parametrizations", None)
    if parametrizations is None or "weight" not in parametrizations:
        return module.weight.detach()
    g, v = parametrizations.weight.original0.detach(), parametrizations.weight.original1.detach()
    dims = tuple(range(1, v.dim()))
    return g * v / v.norm(dim=dims, keepdim=True)


class _Conv(nn.Module):
    """A folded Conv1d / ConvTranspose1d with the source module's geometry."""

    def __init__(self, conv: nn.Module):
        super().__init__()
        self.weight = nn.Parameter(fold(conv).clone(), requires_grad=False)
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach().clone(), requires_grad=False)
        self.transposed = isinstance(conv, nn.ConvTranspose1d)
        self.stride, self.padding, self.dilation = conv.stride[0], conv.padding[0], conv.dilation[0]

    def forward(self, x):
        if self.transposed:
            return F.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding)
        return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation)


def _snake(alpha: torch.Tensor, x):
    a = alpha[None, :, None]
    s = torch.sin(x * a)
    return x + (1.0 / (a + 1e-9)) * s * s


class _ResBlock(nn.Module):
    def __init__(self, block: nn.Module):
        super().__init__()
        self.convs1 = nn.ModuleList(_Conv(c) for c in block.convs1)
        self.convs2 = nn.ModuleList(_Conv(c) for c in block.convs2)
        self.alpha1 = nn.ParameterList(nn.Parameter(a.alpha.detach().clone(), requires_grad=False) for a in block.activations1)
        self.alpha2 = nn.ParameterList(nn.Parameter(a.alpha.detach().clone(), requires_grad=False) for a in block.activations2)

    def forward(self, x, keep=None):
        """`keep` [1, 1, T] (1 on real frames): each conv's output is zeroed past them, as the
        official call's zero padding sees a signal that ends there (Snake keeps zeros zero)."""
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.alpha1, self.alpha2):
            x = x + _masked(c2(_snake(a2, _masked(c1(_snake(a1, x)), keep))), keep)
        return x


def _masked(x, keep):
    return x if keep is None else x * keep


def _keep(length: int, real, dtype) -> torch.Tensor:
    """[1, 1, length]: 1 on the first `real` ([1] int) positions, 0 after."""
    return (torch.arange(length) < real).to(dtype)[None, None]


def _dft_kernels(n_fft: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Windowed forward DFT [2 bins, 1, n_fft], windowed inverse real DFT [2 bins, 1, n_fft], window."""
    n = np.arange(n_fft)
    window = 0.5 - 0.5 * np.cos(2 * np.pi * n / n_fft)  # periodic Hann (scipy get_window "hann", fftbins)
    bins = n_fft // 2 + 1
    angle = 2 * np.pi * np.outer(np.arange(bins), n) / n_fft
    forward = np.concatenate((window * np.cos(angle), -window * np.sin(angle)))[:, None]
    weight = np.full((bins, 1), 2.0)
    weight[0] = weight[-1] = 1.0  # onesided: DC and Nyquist once
    inverse = np.concatenate((weight * np.cos(angle), -weight * np.sin(angle))) * window / n_fft
    as_t = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    return as_t(forward), as_t(inverse[:, None]), as_t(window)


class HiFT(nn.Module):
    """mel [1, 80, F], noise [1, 480 F, 9], cache_source [1, 1, 3840], use_cache [1]
    -> wav [1, 480 F], source [1, 1, 480 F] (the next call's `cache_source` is its last 3840)."""

    def __init__(self, hift: nn.Module, frames: int):
        super().__init__()
        f0 = hift.f0_predictor
        self.f0_convs = nn.ModuleList(_Conv(m) for m in f0.condnet if not isinstance(m, nn.ELU))
        self.f0_linear = f0.classifier
        self.source_linear = hift.m_source.l_linear
        self.conv_pre, self.conv_post = _Conv(hift.conv_pre), _Conv(hift.conv_post)
        self.ups = nn.ModuleList(_Conv(u) for u in hift.ups)
        self.source_downs = nn.ModuleList(_Conv(d) for d in hift.source_downs)
        self.source_resblocks = nn.ModuleList(_ResBlock(b) for b in hift.source_resblocks)
        self.resblocks = nn.ModuleList(_ResBlock(b) for b in hift.resblocks)
        self.kernels = hift.num_kernels
        self.n_fft, self.hop = hift.istft_params["n_fft"], hift.istft_params["hop_len"]
        self.audio_limit = hift.audio_limit
        self.upsample = int(np.prod([u.stride[0] for u in hift.ups])) * self.hop
        samples = frames * self.upsample
        self.frames = frames
        self.register_buffer("harmonics", torch.arange(1, HARMONICS + 1, dtype=torch.float32))
        # linear x`upsample` resampling of per-frame values (align_corners=False, edges clamped)
        lo = np.floor(np.maximum((np.arange(samples) + 0.5) / self.upsample - 0.5, 0.0)).astype(np.int64)
        self.register_buffer("lo", torch.tensor(lo))
        self.register_buffer("hi", torch.tensor(np.minimum(lo + 1, frames - 1)))
        forward, inverse, window = _dft_kernels(self.n_fft)
        self.register_buffer("stft_kernel", forward)
        self.register_buffer("istft_kernel", inverse)
        stft_frames = samples // self.hop + 1
        ola = F.conv_transpose1d(torch.ones(1, 1, stft_frames), (window * window)[None, None], stride=self.hop)
        pad = self.n_fft // 2
        self.register_buffer("ola_inverse", 1.0 / ola[..., pad : pad + samples])

    def _f0(self, mel, keep=None):
        x = mel
        for conv in self.f0_convs:
            x = _masked(F.elu(conv(x)), keep)
        return torch.abs(self.f0_linear(x.transpose(1, 2)).squeeze(-1))  # [1, F]

    def _weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The resampling weights of sample j between frames lo[j] and hi[j], computed in float32 in
        the graph as torch's kernel does (scale 1/480 in float32; an fp16 build must not round
        them: the phase reaches ~1e4 rad within a second, a weight one ulp off moves it ~1e-3)."""
        samples = self.lo.shape[0]
        src = torch.arange(samples, dtype=torch.float32) + 0.5
        src = torch.clamp(src * float(np.float32(1.0 / self.upsample)) - 0.5, min=0.0)
        w_hi = (src - self.lo.to(torch.float32))[None, :, None]
        return 1.0 - w_hi, w_hi

    def _source(self, f0, noise, frames=None):
        """Always float32 (also in an fp16 build): phases of ~1e4 rad have no fp16 representation.
        `frames` [1]: the real frames (the resampling's upper neighbour is clamped at the last)."""
        dtype, f0, noise = noise.dtype, f0.to(torch.float32), noise.to(torch.float32)
        rad = f0[:, :, None] * self.harmonics.to(torch.float32) / SAMPLE_RATE
        rad = rad - torch.floor(rad)
        # The prefix sum as torch's CPU cumsum gives it (float32 rounding of a double sum): the
        # increments split into a 12-bit head, whose sums are exact in float32 in any order, and
        # a tail whose sums are ~2^-13 small; adding the two rounds once.
        head = torch.round(rad * 4096.0) / 4096.0
        cycles = torch.cumsum(head, dim=1) + torch.cumsum(rad - head, dim=1)
        phase = cycles * (2 * math.pi) * self.upsample  # [1, F, 9]
        w_lo, w_hi = self._weights()
        hi = self.hi if frames is None else torch.minimum(self.lo + 1, frames - 1)
        phase = phase[:, self.lo] * w_lo + phase[:, hi] * w_hi  # [1, S, 9]
        f0_samples = f0[:, :, None].expand(1, self.frames, self.upsample).reshape(1, -1, 1)
        uv = (f0_samples > VOICED_THRESHOLD).to(torch.float32)
        amp = uv * NOISE_STD + (1 - uv) * (SINE_AMP / 3)
        sines = torch.sin(phase) * SINE_AMP * uv + amp * noise
        merge = self.source_linear
        merged = torch.matmul(sines, merge.weight.to(torch.float32).t()) + merge.bias.to(torch.float32)
        return torch.tanh(merged).transpose(1, 2).to(dtype)  # [1, 1, S]

    def _decode(self, mel, source, frames=None):
        """`frames` [1] (None: all): the real mel frames; every stage is then zeroed past what
        they reach, so each conv's padding and the STFT's reflection see the signal end there."""
        pad = self.n_fft // 2
        samples = source.shape[2]
        real = None if frames is None else frames * self.upsample
        keep = (lambda length, n: None) if frames is None else (lambda length, n: _keep(length, n, mel.dtype))  # noqa: E731
        if real is None:
            padded = F.pad(source, (pad, pad), mode="reflect")
        else:  # the reflection at the last real sample: a gather of reflected positions
            at = torch.abs(torch.arange(samples + 2 * pad) - pad)
            at = torch.where(at >= real, 2 * (real - 1) - at, at).clamp(0, samples - 1)
            padded = source[:, :, at]
        spec = F.conv1d(padded, self.stft_kernel, stride=self.hop)
        spec = _masked(spec, keep(spec.shape[2], None if real is None else real // self.hop + 1))
        x = _masked(self.conv_pre(_masked(mel, keep(mel.shape[2], frames))), keep(mel.shape[2], frames))
        scale = 1
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, LEAKY_SLOPE))
            scale *= up.stride
            extra = 0
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
                extra = 1
            k = keep(x.shape[2], None if frames is None else frames * scale + extra)
            x = _masked(x, k)
            x = x + self.source_resblocks[i](_masked(self.source_downs[i](spec), k), k)
            blocks = self.resblocks[i * self.kernels : (i + 1) * self.kernels]
            total = blocks[0](x, k)
            for block in blocks[1:]:
                total = total + block(x, k)
            x = total / self.kernels
        x = self.conv_post(F.leaky_relu(x))
        bins = self.n_fft // 2 + 1
        magnitude = torch.clamp(torch.exp(x[:, :bins]), max=1e2)
        phase = torch.sin(x[:, bins:])
        coeffs = torch.cat((magnitude * torch.cos(phase), magnitude * torch.sin(phase)), dim=1)
        if real is None:
            wav = F.conv_transpose1d(coeffs, self.istft_kernel, stride=self.hop)
            wav = wav[:, 0, pad : pad + samples] * self.ola_inverse[:, 0]
        else:  # only the real STFT frames, normalized by their own overlap-added window
            spec_keep = keep(coeffs.shape[2], real // self.hop + 1)
            wav = F.conv_transpose1d(coeffs * spec_keep, self.istft_kernel, stride=self.hop)[:, 0, pad : pad + samples]
            ola = F.conv_transpose1d(spec_keep, self.window_sq, stride=self.hop)[:, 0, pad : pad + samples]
            wav = torch.where(ola > 0, wav / torch.where(ola > 0, ola, torch.ones_like(ola)), torch.zeros_like(ola))
            wav = wav * keep(samples, real)[:, 0]
        return torch.clamp(wav, -self.audio_limit, self.audio_limit)

    def forward(self, mel, noise, cache_source, use_cache):
        source = self._source(self._f0(mel), noise)
        keep = cache_source.shape[2]
        head = use_cache * cache_source + (1 - use_cache) * source[:, :, :keep]
        source = torch.cat((head, source[:, :, keep:]), dim=2)
        return self._decode(mel, source), source


class HiFTStream(HiFT):
    """Every call of a stream in one graph, the flush included: mel [1, 80, F] (F = 64 by default:
    8 cached frames + 2 x 28, the most a last call brings; the first `frames` real), noise
    [1, 480 F, 9], cache_source, use_cache as `HiFT` takes them, frames [1] -> wav, source
    [1, 480 F] / [1, 1, 480 F], their first 480 `frames` samples real and the rest zero.

    HiFT's convs are not causal (its padding reads past the last frame, its STFT reflects there),
    so a shorter call is not a prefix of a longer one: each stage is zeroed past the real frames,
    the sine source's resampling is clamped at the last real frame, the STFT reflects at the last
    real sample and the ISTFT overlap-adds and normalizes only the real STFT frames, which is
    what the official call on `frames` frames computes."""

    def __init__(self, hift: nn.Module, frames: int):
        super().__init__(hift, frames)
        _, _, window = _dft_kernels(self.n_fft)
        self.register_buffer("window_sq", (window * window)[None, None])

    def forward(self, mel, noise, cache_source, use_cache, frames):
        source = self._source(self._f0(mel, _keep(mel.shape[2], frames, mel.dtype)), noise, frames)
        keep = cache_source.shape[2]
        head = use_cache * cache_source + (1 - use_cache) * source[:, :, :keep]
        source = torch.cat((head, source[:, :, keep:]), dim=2) * _keep(source.shape[2], frames * self.upsample, source.dtype)
        return self._decode(mel, source, frames), source


class _FixedDraws:
    """`torch` as the official sine generator sees it, with its two draws replaced: `rand` (the
    initial phases) by `phase`, `randn_like` by `noise` for the harmonics' noise and by zeros for
    the noise branch SourceModuleHnNSF2 draws and HiFT drops."""

    def __init__(self, real, phase, noise):
        self._real, self._phase, self._noise = real, phase, noise

    def __getattr__(self, name):
        return getattr(self._real, name)

    def rand(self, *shape, **_kwargs):
        return self._phase.clone()

    def randn_like(self, like, **_kwargs):
        return self._noise.clone() if like.shape == self._noise.shape else self._real.zeros_like(like)


@torch.no_grad()
def hift_stream_reference(hift, layers_module, mel, noise, cache_source, use_cache, frames):
    """`hift_reference` on the first `frames` mel frames (and their noise), wav and source
    zero-padded to the graph's width."""
    count = int(frames.reshape(-1)[0])
    samples = noise.shape[1] // mel.shape[2]
    wav, source = hift_reference(hift, layers_module, mel[..., :count], noise[:, :count * samples], cache_source, use_cache)
    width = mel.shape[2] * samples
    return F.pad(wav, (0, width - wav.shape[-1])), F.pad(source, (0, width - source.shape[-1]))


@torch.no_grad()
def hift_reference(hift, layers_module, mel, noise, cache_source, use_cache, phase=None):
    """The official `HiFTGenerator.forward(mel, cache_source)` with its random draws fixed (the
    initial phases default to zeros: they do not reach the output)."""
    phase = torch.zeros(1, HARMONICS) if phase is None else phase
    real = layers_module.torch
    layers_module.torch = _FixedDraws(real, phase, noise)
    try:
        cache = cache_source if float(use_cache.reshape(-1)[0]) > 0 else torch.zeros(1, 1, 0)
        wav, source = hift(mel, cache)
    finally:
        layers_module.torch = real
    return wav, source
