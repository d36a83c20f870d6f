"""Export-friendly transformer pieces over Hugging Face modules (attention, RMSNorm, MLP).

Hugging Face forwards hide the KV cache in `Cache` objects, build masks with vmap and choose the
kernel at run time; none of that survives torch.export into static edge graphs. These functions use
the *parameters* of an HF layer (its torch `nn.Linear` projections, norm weights, layer scales)
but compute everything themselves, taking the past keys/values and an additive mask as plain
tensors and returning the new keys/values, so a recipe can place the cache wherever its
deployment wants it (graph input/output, in-graph ring buffer, unrolled steps).

They call no HF forward and no HF utility (RoPE init, activations, scaling attributes): the eager
reference runs the HF modules, so a bug on either side shows at the parity gate instead of
cancelling out. RoPE frequencies and the attention scale come from the config.
"""

from __future__ import annotations

import torch
from torch import nn

NEG_INF = -1.0e4  # additive mask value: exp() underflows to exactly 0 in fp32 and fp16 alike


def rope_inv_freq(config) -> torch.Tensor:
    """The default (unscaled) RoPE frequencies of an HF config: rope_theta over head_dim (NeoX
    pairs). Other RoPE types are refused rather than approximated."""
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind != "default" or getattr(config, "partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"RoPE type {kind!r} (partial factor {getattr(config, 'partial_rotary_factor', 1.0)}) has no graph implementation")
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)


FP32_BUFFERS = "edgex_fp32_buffers"  # module attribute: names of its buffers fp16 exports keep in float32


def rope_table(inv_freq: torch.Tensor, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """NeoX rotate-half cos, sin [positions, 2 x len(inv_freq)] of the angles p x f for p < `positions`,
    computed in float64 and stored in float32."""
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    return emb.cos().to(torch.float32), emb.sin().to(torch.float32)


def register_rope(module: nn.Module, name: str, inv_freq: torch.Tensor, positions: int | None) -> None:
    """The RoPE of a graph whose positions stay below `positions`, as buffers of `module` that
    `rope_cos_sin(module, name, ...)` reads: the cos / sin table over every such position
    (`<name>_cos`, `<name>_sin`, `rope_table`), which the graph gathers rows of.

    A runtime that runs a graph in fp16 (the QNN HTP at fp16, MNN fp16) evaluates an angle computed
    in the graph, position x frequency, in fp16: spacing 0.125 rad at positions 128-255, an error that
    grows with the position. Rotating 128-wide random keys (theta 1e6) with angles computed so scores
    about 38 dB at position 255 and 25 dB at 1000; with exact angles whose cos / sin are rounded to
    fp16 (the table of an fp16 export: cos and sin lie in [-1, 1]) about 77 dB. The table covers the
    positions the component declares (its KV slots, its chunk), so the graph never reads a row
    beyond it.

    `positions` None, for a graph whose positions have no bound (an absolute frame index over a whole
    stream), keeps the product in the graph: `<name>_inv_freq`, which fp16 exports keep in float32
    (`exporters.base.module_in` reads `FP32_BUFFERS`). Rounded to fp16 (11 significant bits), a
    frequency is off by up to 2^-12 of itself and each angle by position times that: about 0.25 rad
    at position 1000 for the fastest pair."""
    if positions is None:
        module.register_buffer(f"{name}_inv_freq", inv_freq.to(torch.float32), persistent=False)
        setattr(module, FP32_BUFFERS, frozenset({*getattr(module, FP32_BUFFERS, ()), f"{name}_inv_freq"}))
        return
    cos, sin = rope_table(inv_freq, positions)
    module.register_buffer(f"{name}_cos", cos, persistent=False)
    module.register_buffer(f"{name}_sin", sin, persistent=False)


def rope_cos_sin(module: nn.Module, name: str, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The RoPE `register_rope` gave `module` under `name` at integer `positions` [P] -> cos, sin
    [1, 1, P, head_dim]: the table's rows at those positions, or the angles computed in the graph
    where the graph has no table."""
    table = getattr(module, f"{name}_cos", None)
    if table is not None:
        cos, sin = table.index_select(0, positions), getattr(module, f"{name}_sin").index_select(0, positions)
    else:
        freqs = positions.to(torch.float32)[:, None] * getattr(module, f"{name}_inv_freq").to(torch.float32)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
    return cos.to(dtype)[None, None], sin.to(dtype)[None, None]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


def attach_norm_constants(module: nn.Module) -> None:
    """Give every HF RMSNorm under `module` the non-persistent constants `rms_norm` reads: the 1/n and
    ones columns and sqrt(eps).

    Buffers are weights to torch.export; a tensor built during tracing would be an op instead."""
    for norm in module.modules():
        if hasattr(norm, "variance_epsilon") and not hasattr(norm, "edgex_mean_column"):
            n = norm.weight.shape[-1]
            norm.register_buffer("edgex_mean_column", torch.full((n, 1), 1.0 / n), persistent=False)
            norm.register_buffer("edgex_ones_column", torch.ones(n, 1), persistent=False)
            norm.register_buffer("edgex_eps_root", torch.full((1,), norm.variance_epsilon**0.5), persistent=False)


PEAK_FLOOR = 2.0**-14  # the smallest normal fp16: a row's peak is at least this (rms_norm; the ExecuTorch exporter's LayerNorm)


def rms_norm(norm: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """An HF RMSNorm (`weight`, `variance_epsilon`) with the mean of squares as a matmul against a
    constant column: the same math, but XNNPACK delegates it (it does not delegate a 3-D mean).

    HF computes the norm in fp32. In fp16 graphs that fp32 island costs two dtype casts per norm,
    which XNNPACK does not delegate: the predictor frame then lowers as ~300 partitions and takes
    many minutes. fp16 graphs therefore stay in fp16, and square each row divided by its own peak
    magnitude: x / sqrt(mean(x^2) + eps) = y / sqrt(mean(y^2) + (sqrt(eps) / peak)^2) with
    y = x / peak, for any peak > 0. Every y^2 lies in [0, 1] and the largest is 1, so the sum of
    squares is between 1 and n whatever the row's scale, and (sqrt(eps) / peak)^2 stays finite with
    the peak floored at the smallest normal fp16. A fixed scale cannot do this: squaring
    x / (16 sqrt(n)) underflows each term for an RMS below ~5 at n = 2048: an embedding row (RMS
    ~0.02) comes out of such a norm at 16.7 dB, the Spark-X2.5 1.7b decode `.pte` at 4.6 dB. ONNX
    Runtime hides it: its CPU kernels compute these fp16 ops in fp32. The row
    maximum is an `amax`, which ExecuTorch's exporter hands to XNNPACK as max pooling."""
    if isinstance(norm, nn.Identity):
        return x
    if x.dtype == torch.float16:
        n = x.shape[-1]
        peak = x.abs().amax(dim=-1, keepdim=True) + PEAK_FLOOR
        y = x / peak
        squares = torch.matmul(y * y, norm.edgex_ones_column)  # in [1, n]
        inv = torch.rsqrt(squares * (1.0 / n) + torch.square(norm.edgex_eps_root / peak))
        return norm.weight * (y * inv)
    x32 = _cast(x, torch.float32)
    variance = torch.matmul(x32 * x32, _cast(norm.edgex_mean_column, torch.float32))
    return norm.weight * _cast(x32 * torch.rsqrt(variance + norm.variance_epsilon), x.dtype)


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x.to(dtype)` only where it converts: torch.export records even a same-dtype `.to` as a
    metadata assert node, which every lowering pass then re-traces (400 of the predictor frame's
    3300 nodes)."""
    return x if x.dtype == dtype else x.to(dtype)


def mask_from_valid(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean [.., Q, K] visibility -> additive float mask."""
    return torch.where(valid, torch.zeros((), dtype=dtype), torch.full((), NEG_INF, dtype=dtype))


def group_mask(mask: torch.Tensor, groups: int, seq: int) -> torch.Tensor:
    """Lay a [1, 1, P, S] mask out for grouped queries ([1, 1, G*P, S]); callers do this once per
    graph so that layers do not each repeat it. Masks that broadcast (P == 1) stay as they are."""
    if mask.shape[2] in (1, groups * seq):
        return mask
    return mask.repeat(1, 1, groups, 1)


def attention(
    attn: nn.Module,
    hidden: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    past_key: torch.Tensor | None,
    past_value: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One HF-style attention layer (q/k/v/o projections, optional q/k norms, GQA).

    hidden [B, P, hidden]; past_key/value [B, KV, S, D] or None; mask additive [1, 1, P, S + P] or
    None (all visible). Returns (output [B, P, hidden], key [B, KV, P, D], value [B, KV, P, D]) where
    key/value are this call's new entries, already rotated, ready to be cached.
    """
    bsz, seq, _ = hidden.shape
    head_dim = attn.head_dim
    q = rms_norm(attn.q_norm, attn.q_proj(hidden).view(bsz, seq, -1, head_dim)).transpose(1, 2)
    k = rms_norm(attn.k_norm, attn.k_proj(hidden).view(bsz, seq, -1, head_dim)).transpose(1, 2)
    v = attn.v_proj(hidden).view(bsz, seq, -1, head_dim).transpose(1, 2)
    q = apply_rope(q, cos, sin)
    k = apply_rope(k, cos, sin)
    keys = k if past_key is None else torch.cat((past_key, k), dim=2)
    values = v if past_value is None else torch.cat((past_value, v), dim=2)
    # GQA without copying K/V: fold each KV head's query group into the query axis
    # ([B, KV*G, P, D] -> [B, KV, G*P, D]), which is exactly HF's repeat_kv head mapping (h -> h // G).
    kv_heads = keys.shape[1]
    groups = q.shape[1] // kv_heads
    q = q.reshape(bsz, kv_heads, groups * seq, head_dim)
    # 3-D bmm: a 4-D matmul decomposes with expand copies that XNNPACK does not delegate.
    slots = keys.shape[2]
    scores = torch.bmm(
        q.reshape(bsz * kv_heads, groups * seq, head_dim), keys.reshape(bsz * kv_heads, slots, head_dim).transpose(1, 2)
    ).reshape(bsz, kv_heads, groups * seq, slots) * head_dim**-0.5
    if mask is not None:
        scores = scores + group_mask(mask, groups, seq)
    probs = torch.softmax(scores, dim=-1)
    out = torch.bmm(
        probs.reshape(bsz * kv_heads, groups * seq, slots), values.reshape(bsz * kv_heads, slots, head_dim)
    ).reshape(bsz, kv_heads * groups, seq, head_dim)
    out = out.transpose(1, 2).reshape(bsz, seq, -1)
    return attn.o_proj(out), k, v


def _silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x): F.silu in fp16 decomposes with an fp32 upcast that XNNPACK does not delegate
    (it would split the graph)."""
    return x * torch.sigmoid(x)


# HF activation module (ACT2FN[config.hidden_act]) -> the graphs' own function
_ACTIVATIONS = {"SiLU": _silu, "SiLUActivation": _silu, "GELU": nn.functional.gelu, "GELUActivation": nn.functional.gelu}


def gated_mlp(mlp: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """HF gate/up/down MLP with the graphs' own activation for the configured one."""
    name = type(mlp.act_fn).__name__
    if name not in _ACTIVATIONS or getattr(mlp.act_fn, "approximate", "none") != "none":
        raise ValueError(f"activation {name} has no graph implementation (known: {', '.join(_ACTIVATIONS)})")
    return mlp.down_proj(_ACTIVATIONS[name](mlp.gate_proj(x)) * mlp.up_proj(x))


def decoder_layer(
    layer: nn.Module,
    hidden: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    past_key: torch.Tensor | None,
    past_value: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A pre-norm HF decoder layer (input_layernorm, self_attn, post_attention_layernorm, mlp),
    honouring optional per-branch layer scales (`self_attn_layer_scale`, `mlp_layer_scale`: a
    per-channel `scale` parameter)."""
    normed = rms_norm(layer.input_layernorm, hidden)
    out, key, value = attention(layer.self_attn, normed, cos, sin, past_key, past_value, mask)
    hidden = hidden + _layer_scaled(layer, "self_attn_layer_scale", out)
    mlp = gated_mlp(layer.mlp, rms_norm(layer.post_attention_layernorm, hidden))
    return hidden + _layer_scaled(layer, "mlp_layer_scale", mlp), key, value


def _layer_scaled(layer: nn.Module, name: str, x: torch.Tensor) -> torch.Tensor:
    scale = getattr(layer, name, None)
    return x if scale is None else x * scale.scale


def step_valid(slots: int, position: torch.Tensor) -> torch.Tensor:
    """[slots + 1] visibility for one new position written after `slots` cache slots, of which the
    first `position` hold real entries. Built from comparisons only: the QNN HTP backend mishandles
    a concatenated boolean constant (measured: every slot masked at position 0, -0.1 dB)."""
    index = torch.arange(slots + 1)
    return (index < position) | (index == slots)


def causal_valid(queries: int, keys: int, device=None) -> torch.Tensor:
    """[Q, K] visibility for Q new positions appended after K - Q cached ones."""
    q = torch.arange(queries, device=device)[:, None] + (keys - queries)
    k = torch.arange(keys, device=device)[None, :]
    return k <= q


def decoder_stack(model: nn.Module, embeds, cos, sin, past_key, past_value, mask):
    """Every decoder layer of `model` (a HF decoder with `.layers` and `.norm`) over `embeds`, with
    explicit per-layer past K/V ([L, ...] tensors or None): final-normed hidden, stacked new K, V."""
    hidden, keys, values = embeds, [], []
    for i, layer in enumerate(model.layers):
        pk = None if past_key is None else past_key[i]
        pv = None if past_value is None else past_value[i]
        hidden, k, v = decoder_layer(layer, hidden, cos, sin, pk, pv, mask)
        keys.append(k)
        values.append(v)
    return rms_norm(model.norm, hidden), torch.stack(keys), torch.stack(values)
