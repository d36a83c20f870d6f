"""Edgex's own eager Spark-X2.5, written from docs/models.md with checkpoint-compatible names.

No package implements this model, so this module *is* the reference every artifact is scored
against. It is written for clarity, not speed: attention repeats K/V per query head, the sliding
window is a mask over absolute positions, and the cache simply grows (`SparkCache`). The export
graphs (`graphs.py`) compute the same function differently (ring buffer, folded GQA, bmm) and call
none of this module's code, only the torch modules holding its parameters, which is why parity
between them means something.

Parameter names follow the published checkpoint: `model.embedding`, `model.layers.N.self_attn.
{q_k_v_proj, g_proj, out_proj}`, `model.layers.N.mlp.{gate,up,down}_proj`, `model.norm`; the LM head
is tied to the embedding and has no tensor of its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .config import FULL, SparkConfig


class RMSNorm(nn.Module):
    """RMSNorm in fp32 (`weight`, `variance_epsilon`: the attribute names edgex.nn's functions read)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x32.to(x.dtype)


def rope_inv_freq(config: SparkConfig, layer_type: str) -> torch.Tensor:
    """inv_freq over the rotary dims of a layer type: the whole head (sliding, theta 1e4) or its
    first 25 % (full, theta 5e6)."""
    if layer_type == FULL:
        dims, theta = int(config.head_dim * config.full_partial_rotary_factor), config.full_rope_theta
    else:
        dims, theta = config.head_dim, config.sliding_rope_theta
    return 1.0 / theta ** (torch.arange(0, dims, 2, dtype=torch.float32) / dims)


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX rotate-half on the first cos.shape[-1] dims of x; the rest pass through."""
    dims = cos.shape[-1]
    rot, rest = x[..., :dims], x[..., dims:]
    half = dims // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    return torch.cat((rot * cos + rotated * sin, rest), dim=-1)


def rope_tables(inv_freq: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[None, None], emb.sin()[None, None]


@dataclass
class LayerCache:
    """Keys/values [1, KV, n, D] of positions start .. start + n - 1."""

    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    start: int = 0

    @property
    def end(self) -> int:
        return self.start + (0 if self.keys is None else self.keys.shape[2])


@dataclass
class SparkCache:
    layers: list[LayerCache] = field(default_factory=list)

    @classmethod
    def empty(cls, config: SparkConfig) -> "SparkCache":
        return cls([LayerCache() for _ in range(config.num_hidden_layers)])

    @property
    def length(self) -> int:
        return max(layer.end for layer in self.layers)


class SparkAttention(nn.Module):
    def __init__(self, config: SparkConfig, layer_type: str):
        super().__init__()
        self.config = config
        self.layer_type = layer_type
        h, d = config.num_attention_heads, config.head_dim
        self.kv_dim = config.num_key_value_heads * d
        self.q_k_v_proj = nn.Linear(config.hidden_size, h * d + 2 * self.kv_dim, bias=False)
        self.g_proj = nn.Linear(config.hidden_size, h, bias=False)
        self.out_proj = nn.Linear(h * d, config.hidden_size, bias=False)

    def forward(self, x, cos, sin, positions: torch.Tensor, cache: LayerCache) -> torch.Tensor:
        cfg = self.config
        b, p, _ = x.shape
        q, k, v = self.q_k_v_proj(x).split([cfg.num_attention_heads * cfg.head_dim, self.kv_dim, self.kv_dim], dim=-1)
        q = apply_partial_rope(q.view(b, p, -1, cfg.head_dim).transpose(1, 2), cos, sin)
        k = apply_partial_rope(k.view(b, p, -1, cfg.head_dim).transpose(1, 2), cos, sin)
        v = v.view(b, p, -1, cfg.head_dim).transpose(1, 2)
        if cache.keys is not None:
            k, v = torch.cat((cache.keys, k), dim=2), torch.cat((cache.values, v), dim=2)
        cache.keys, cache.values = k, v
        key_pos = torch.arange(cache.start, cache.end)
        visible = key_pos[None, :] <= positions[:, None]
        if self.layer_type != FULL:
            visible &= positions[:, None] - key_pos[None, :] < cfg.sliding_window
        groups = cfg.num_attention_heads // cfg.num_key_value_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(cfg.head_dim)
        scores = scores.masked_fill(~visible, float("-inf"))
        out = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v  # [B, H, P, D]
        gate = torch.sigmoid(self.g_proj(x).float())  # [B, P, H], fp32 as published
        out = (out.transpose(1, 2).float() * gate[..., None]).to(x.dtype)
        return self.out_proj(out.reshape(b, p, -1))


class SparkMLP(nn.Module):
    def __init__(self, config: SparkConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x)) * self.up_proj(x))  # exact (erf) GELU


class SparkLayer(nn.Module):
    def __init__(self, config: SparkConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = SparkAttention(config, layer_type)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SparkMLP(config)

    def forward(self, x, cos, sin, positions, cache: LayerCache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, positions, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class SparkModel(nn.Module):
    def __init__(self, config: SparkConfig):
        super().__init__()
        self.embedding = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(SparkLayer(config, t) for t in config.layer_types)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class SparkForCausalLM(nn.Module):
    """`forward(input_ids, cache)` appends to `cache` and returns logits [1, P, vocab]."""

    def __init__(self, config: SparkConfig):
        super().__init__()
        self.config = config
        self.model = SparkModel(config)
        self.inv_freq = {t: rope_inv_freq(config, t) for t in set(config.layer_types)}

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.model.embedding.weight.T  # tied embeddings

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, cache: SparkCache | None = None) -> torch.Tensor:
        cache = cache if cache is not None else SparkCache.empty(self.config)
        start = cache.length
        positions = torch.arange(start, start + input_ids.shape[1])
        tables = {t: rope_tables(f, positions) for t, f in self.inv_freq.items()}
        hidden = self.model.embedding(input_ids)
        for layer, layer_cache in zip(self.model.layers, cache.layers):
            cos, sin = tables[layer.layer_type]
            if layer_cache.keys is None:
                layer_cache.start = start
            hidden = layer(hidden, cos.to(hidden.dtype), sin.to(hidden.dtype), positions, layer_cache)
        return self.lm_head(self.model.norm(hidden))

    @torch.no_grad()
    def greedy(self, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Greedy continuation [1, new_tokens] of `prompt` [1, P] (the reference generation)."""
        cache = SparkCache.empty(self.config)
        logits = self(prompt, cache)
        tokens = []
        for _ in range(new_tokens):
            tokens.append(int(logits[0, -1].argmax()))
            logits = self(torch.tensor([[tokens[-1]]]), cache)
        return torch.tensor([tokens])


EMBEDDING_STD = 0.1


@torch.no_grad()
def seeded_init(model: SparkForCausalLM, seed: int) -> None:
    """Fan-in scaled weights and a small embedding, so that logits are spread (no near-ties that
    would make greedy agreement luck) and greedy text does not just repeat its input token: with
    tied embeddings a large embedding makes a token predict itself (std 0.3: 8 distinct tokens in
    64 greedy steps on the tiny preset; std 0.1: 61)."""
    gen = torch.Generator().manual_seed(seed)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, 1.0 / math.sqrt(module.in_features), generator=gen)
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, EMBEDDING_STD, generator=gen)
        elif isinstance(module, RMSNorm):
            module.weight.uniform_(0.8, 1.2, generator=gen)


def build(config: SparkConfig, seed: int) -> SparkForCausalLM:
    model = SparkForCausalLM(config).eval()
    seeded_init(model, seed)
    return model
