"""Voice-prompt graphs of a Base checkpoint: what a device that clones a voice runs on reference audio.

- `speaker_encoder`: the official x-vector encoder (`Qwen3TTSSpeakerEncoder`, an ECAPA-TDNN) on the
  reference audio's log-mel spectrogram [1, frames, 128] -> the speaker embedding [1, H] that takes
  the speaker row of a voice-clone prompt. The mel spectrogram sits beside the graph (the runner's
  `runner.log_mel`), as the embedding tables do: the official code computes it before the module.
- `speech_encoder`: the speech tokenizer's encoder (`Qwen3TTSTokenizerV2Encoder`, a Mimi encoder:
  causal SEANet convs, a causal sliding-window transformer, a stride-2 downsample and the split
  residual vector quantizer) on 24 kHz samples [1, 1, S] -> the reference codes [1, 16, S / 1920]
  and the latent they quantize [1, D, S / 1920].

Both graphs take a fixed reference length (`reference_frames` 80 ms frames). The references are
the official modules, unmodified: `Qwen3TTSForConditionalGeneration.extract_speaker_embedding`'s
module on the official mel spectrogram, and `Qwen3TTSTokenizerV2Model.encode`'s Mimi `encode`.
The encoder graph is a static-shape rewrite of the same arithmetic (the library computes its conv
padding from tensor lengths, which `torch.export` cannot trace with static shapes).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

GROUPS = 16  # codebooks the talker reads (`encoder_valid_num_quantizers`)
SAMPLES_PER_FRAME = 1920
SAMPLE_RATE = 24000
# The official mel spectrogram (`extract_speaker_embedding`): n_fft, hop, window, mel bins, fmin, fmax.
MEL = dict(n_fft=1024, num_mels=128, sampling_rate=SAMPLE_RATE, hop_size=256, win_size=1024, fmin=0, fmax=12000)


def mel_frames(samples: int) -> int:
    """Mel frames of `samples` samples: reflect padding of (n_fft - hop) / 2 each side, no centring."""
    pad = (MEL["n_fft"] - MEL["hop_size"]) // 2
    return (samples + 2 * pad - MEL["n_fft"]) // MEL["hop_size"] + 1


@torch.no_grad()
def official_mels(audio) -> torch.Tensor:
    """The official log-mel spectrogram [1, frames, 128] of 24 kHz audio [samples]."""
    from .qwen_tts_import import qwen_tts_modules

    wav = torch.as_tensor(audio, dtype=torch.float32).reshape(1, -1)
    return qwen_tts_modules().modeling.mel_spectrogram(wav, **MEL).transpose(1, 2)


@torch.no_grad()
def speaker_reference(speaker_encoder: nn.Module, mels: torch.Tensor) -> tuple[torch.Tensor]:
    """The official speaker encoder on mels [1, frames, 128] -> embedding [1, H]."""
    return (speaker_encoder(mels),)


class SpeakerEncoder(nn.Module):
    """The speaker encoder as exported: the official module (its convs, pooling and masks have
    static shapes once the mel length is fixed)."""

    def __init__(self, speaker_encoder: nn.Module):
        super().__init__()
        self.encoder = speaker_encoder

    def forward(self, mels):
        return self.encoder(mels)


@torch.no_grad()
def speech_reference(encoder: nn.Module, wav: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The official Mimi encode on wav [1, 1, S] (`Qwen3TTSTokenizerV2Model.encode` keeps the first 16
    codebooks of its codes), and the latent the quantizer reads [1, D, frames]."""
    codes = encoder.encode(wav, return_dict=True).audio_codes[:, :GROUPS]
    embeddings = encoder.encoder(wav)
    hidden = encoder.encoder_transformer(embeddings.transpose(1, 2), return_dict=True)[0]
    latent = encoder.downsample(hidden.transpose(1, 2))
    return codes, latent


def _static_conv(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A Mimi conv (`MimiConv1d.forward`, no streaming cache) with its padding computed in Python ints."""
    inner = conv.conv
    kernel = (inner.kernel_size[0] - 1) * inner.dilation[0] + 1
    stride = inner.stride[0]
    total = kernel - stride
    length = x.shape[-1]
    frames = -(-(length - kernel + total) // stride)  # ceil((L - k + pad) / stride + 1) - 1
    extra = frames * stride + kernel - total - length
    left, right = (total, extra) if conv.causal else (total - total // 2, total // 2 + extra)
    if conv.pad_mode == "reflect":
        raise ValueError("reflect-padded Mimi convs are not supported by the static encoder graph")
    return inner(F.pad(x, (left, right), mode=conv.pad_mode))


class SpeechEncoder(nn.Module):
    """wav [1, 1, S] -> codes [1, 16, frames] (int64), latent [1, D, frames].

    The same arithmetic as the official encode, shapes fixed: SEANet convs with static padding, the
    transformer layers under an explicit causal sliding-window mask, the downsample conv, then each
    residual quantizer's nearest codebook entry (arg min of |e|^2 - 2 x.e, the same arg min as the
    library's Euclidean distance) and its residual."""

    def __init__(self, encoder: nn.Module, samples: int):
        super().__init__()
        self.encoder = encoder
        with torch.no_grad():
            steps = encoder.encoder(torch.zeros(1, 1, samples)).shape[-1]
        window = encoder.config.sliding_window
        q = torch.arange(steps)[:, None]
        k = torch.arange(steps)[None, :]
        allowed = (k <= q) & (q - k < window)
        self.register_buffer("mask", torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None], persistent=False)
        self.register_buffer("positions", torch.arange(steps)[None], persistent=False)
        quantizer = encoder.quantizer
        books = [quantizer.semantic_residual_vector_quantizer, quantizer.acoustic_residual_vector_quantizer]
        self.projections = nn.ModuleList(b.input_proj if b.input_proj is not None else nn.Identity() for b in books)
        self.counts = [quantizer.num_semantic_quantizers, GROUPS - quantizer.num_semantic_quantizers]
        for i, (book, count) in enumerate(zip(books, self.counts)):
            embed = torch.stack([layer.codebook.embed_sum / layer.codebook.cluster_usage.clamp(min=layer.codebook.epsilon)[:, None]
                                 for layer in book.layers[:count]])
            self.register_buffer(f"codebooks{i}", embed, persistent=False)
            self.register_buffer(f"norms{i}", (embed * embed).sum(-1), persistent=False)

    def _layers(self, modules, x):
        from transformers.models.mimi.modeling_mimi import MimiConv1d, MimiResnetBlock

        for layer in modules:
            if isinstance(layer, MimiConv1d):
                x = _static_conv(layer, x)
            elif isinstance(layer, MimiResnetBlock):
                x = self._layers(layer.block, x) + (layer.shortcut(x) if not isinstance(layer.shortcut, MimiConv1d)
                                                    else _static_conv(layer.shortcut, x))
            else:
                x = layer(x)
        return x

    def forward(self, wav):
        enc = self.encoder
        hidden = self._layers(enc.encoder.layers, wav).transpose(1, 2)
        for layer in enc.encoder_transformer.layers:
            hidden = layer(hidden, attention_mask=self.mask, position_ids=self.positions)[0]
        latent = _static_conv(enc.downsample, hidden.transpose(1, 2))
        codes = []
        for i, (projection, count) in enumerate(zip(self.projections, self.counts)):
            residual = projection(latent).transpose(1, 2)[0]  # [frames, dim]
            books, norms = getattr(self, f"codebooks{i}"), getattr(self, f"norms{i}")
            for k in range(count):
                index = torch.argmin(norms[k][None] - 2.0 * residual @ books[k].T, dim=-1)
                codes.append(index)
                residual = residual - books[k][index]
        return torch.stack(codes)[None], latent


def frames_of(samples: int) -> int:
    """Reference frames the official encode keeps for `samples` samples (ceil(samples / 1920))."""
    return math.ceil(samples / SAMPLES_PER_FRAME)
