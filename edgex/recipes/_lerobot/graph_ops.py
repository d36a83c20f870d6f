"""Graph-side building blocks of the LeRobot policy graphs (never used by the eager references).

Normalization is baked as an affine map per feature, computed in float64 from the statistics, so
the graph holds two constant vectors instead of the processor's mode dispatch; attention is written
out with matmuls (ONNX, QNN and Core ML lower it alike) from `nn.MultiheadAttention`'s weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...errors import EdgexError

_EPS = 1e-8  # LeRobot's normalizer epsilon (docs/models.md)


def affine(stats: dict, mode: str, shape: tuple[int, ...], inverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) with `x * scale + shift` = normalize (or unnormalize) under `mode`."""
    if mode == "IDENTITY" or not stats:
        return torch.ones(shape), torch.zeros(shape)
    if mode == "MEAN_STD":
        mean, std = stats["mean"].double(), stats["std"].double()
        scale, shift = (std, mean) if inverse else (1 / (std + _EPS), -mean / (std + _EPS))
    elif mode == "MIN_MAX":
        low, high = stats["min"].double(), stats["max"].double()
        span = torch.where(high - low == 0, torch.full_like(low, _EPS), high - low)
        scale, shift = (span / 2, span / 2 + low) if inverse else (2 / span, -2 * low / span - 1)
    else:
        raise EdgexError(f"normalization mode {mode} is not supported by edgex's policy graphs (MEAN_STD, MIN_MAX, IDENTITY)")
    return scale.float().reshape(shape), shift.float().reshape(shape)


class Affine(nn.Module):
    """x * scale + shift with constant scale / shift: one feature's (un)normalization."""

    def __init__(self, stats: dict, mode: str, shape: tuple[int, ...], inverse: bool = False):
        super().__init__()
        scale, shift = affine(stats, mode, shape, inverse)
        self.register_buffer("scale", scale, persistent=False)
        self.register_buffer("shift", shift, persistent=False)

    def forward(self, x):
        return x * self.scale + self.shift


def mode_of(config, feature) -> str:
    mode = config.normalization_mapping.get(feature.type.value)
    return "IDENTITY" if mode is None else mode.value


def image_norm(config, stats: dict, camera: str) -> nn.Module:
    """One camera's image normalization with its own statistics (LeRobot keeps them per feature):
    an `Affine`, or nothing where the config leaves images as they are."""
    feature = config.image_features[camera]
    mode = mode_of(config, feature)
    if mode == "IDENTITY" or not stats.get(camera):
        return nn.Identity()
    return Affine(stats[camera], mode, (1, feature.shape[0], 1, 1))


def attention(mha: nn.MultiheadAttention, query, key, value):
    """`nn.MultiheadAttention` (sequence-first, no mask, eval) as matmuls: [S, B, D] in and out."""
    d, heads = mha.embed_dim, mha.num_heads
    w, b = mha.in_proj_weight, mha.in_proj_bias
    q = nn.functional.linear(query, w[:d], b[:d])
    k = nn.functional.linear(key, w[d:2 * d], b[d:2 * d])
    v = nn.functional.linear(value, w[2 * d:], b[2 * d:])

    def split(x):  # [S, B, D] -> [B, H, S, Dh]
        return x.reshape(x.shape[0], x.shape[1], heads, d // heads).permute(1, 2, 0, 3)

    scores = split(q) @ split(k).transpose(-1, -2) / math.sqrt(d // heads)
    out = scores.softmax(-1) @ split(v)  # [B, H, S, Dh]
    out = out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], d)
    return mha.out_proj(out)


MASKED = -1e4  # a masked attention score: finite, so fp16 graphs keep it (exp underflows to 0 all the same)


def grouped_attention(q, k, v, allowed, kv_heads: int):
    """Grouped-query attention with a boolean mask, as the flow VLAs' VLM and action expert compute
    it: q [1, S, H, D], k/v [1, T, KV, D], allowed [1, S, T] -> [1, S, H * D]."""
    group = q.shape[2] // kv_heads
    k = k.repeat_interleave(group, 2)
    v = v.repeat_interleave(group, 2)
    scores = (q.transpose(1, 2) @ k.permute(0, 2, 3, 1)) * q.shape[-1] ** -0.5  # [1, H, S, T]
    scores = torch.where(allowed[:, None], scores, torch.full_like(scores, MASKED))
    out = scores.softmax(-1) @ v.transpose(1, 2)  # [1, H, S, D]
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1)


def gelu_tanh(x):
    """The tanh-approximated GELU (SigLIP's, Gemma's) as x * sigmoid(2 sqrt(2/pi) (x + 0.044715 x^3)),
    the same function as 0.5 x (1 + tanh(...)). Not `F.gelu(approximate="tanh")`: ExecuTorch 1.5.1's
    XNNPACK delegate lowers that op as the exact (erf) GELU, which cost SmolVLA's vision encoder 50 dB
    (76 dB instead of >= 125 dB in fp32; docs/toolchains.md)."""
    return x * torch.sigmoid(2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x))


def siglip_layer(layer, x, heads: int):
    """One SigLIP encoder layer (transformers' module, eval) as plain ops: x [1, N, width]."""
    a = layer.self_attn
    h = layer.layer_norm1(x)
    split = (1, x.shape[1], heads, -1)
    q, k, v = a.q_proj(h).reshape(split), a.k_proj(h).reshape(split), a.v_proj(h).reshape(split)
    scores = (q.transpose(1, 2) @ k.permute(0, 2, 3, 1)) * q.shape[-1] ** -0.5
    out = (scores.softmax(-1) @ v.transpose(1, 2)).transpose(1, 2).reshape(x.shape)
    x = x + a.out_proj(out)
    return x + layer.mlp.fc2(gelu_tanh(layer.mlp.fc1(layer.layer_norm2(x))))
