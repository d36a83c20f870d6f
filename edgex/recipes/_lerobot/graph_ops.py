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
