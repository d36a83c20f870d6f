"""Export graphs: a prefill chunk and a one-token decode step over explicit cache state.

State a runner keeps between calls (all static shapes):
  ring_key / ring_value  [sliding layers, 1, KV, window, D]: the sliding layers' last `window`
      positions, position p in slot p % window. The graph does the ring bookkeeping itself (which
      slot to overwrite, which slots are inside the window, which chunk rows land where) and returns
      the updated ring, so the runner just feeds it back (on ExecuTorch / QNN the output can alias
      the input buffer); nothing is recomputed or shifted outside the graph.
  past_key / past_value  [full layers, 1, KV, context, D]: the full layers' cache, `context` slots;
      slots >= the current position are masked, so the runner need not clear them. A call returns
      only its new entries (`key`/`value`, [full layers, 1, KV, P, D]), which the runner writes at
      the call's positions: copying the whole context back every token would cost far more.

The eager model (`model.py`) is the reference, and these graphs share no numerical code with it:
they apply its parameters through the torch `nn.Linear` / `nn.Embedding` modules that hold them
(module calls, so quantizers that act per module and `float_only` patterns still see them) and read
the config, and compute everything else themselves (RoPE frequencies, tables and rotation, masks,
attention, the head gate, the MLP and its activation, the norms). A bug in either implementation
therefore shows as a parity loss instead of cancelling out; `tests/test_spark.py` breaks the
reference's functions to prove it. `reference.py` runs the eager model on these graphs' inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...nn.transformer import (apply_rope, attach_norm_constants, causal_valid, group_mask, mask_from_valid, rms_norm,
                              register_rope, rope_cos_sin)
from .config import FULL, SLIDING, SparkConfig


def rotary_inv_freq(config: SparkConfig, layer_type: str) -> torch.Tensor:
    """RoPE frequencies for a layer type, from the config (docs/models.md): NeoX pairs over the rotary
    dims, theta 1e4 over the whole head for sliding layers, theta 5e6 over the first 25 % for full ones."""
    if layer_type == SLIDING:
        theta, rotary = config.sliding_rope_theta, config.head_dim
    else:
        theta, rotary = config.full_rope_theta, int(config.head_dim * config.full_partial_rotary_factor)
    exponents = torch.arange(0, rotary, 2, dtype=torch.float32) / rotary
    return 1.0 / torch.pow(torch.tensor(theta, dtype=torch.float32), exponents)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first cos.shape[-1] dims of each head, pass the rest through."""
    rotary = cos.shape[-1]
    if rotary == x.shape[-1]:
        return apply_rope(x, cos, sin)
    return torch.cat((apply_rope(x[..., :rotary], cos, sin), x[..., rotary:]), dim=-1)


def _gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact (erf) GELU, as Spark-X2.5 publishes it (docs/models.md; llama.cpp's tanh form is not it).
    The torch op, so each exporter lowers it to its format's own GELU."""
    return F.gelu(x, approximate="none")


class _SparkGraph(nn.Module):
    def __init__(self, model: nn.Module, context: int):
        """`context`: the full layers' cache slots, the bound of every position the graph takes."""
        super().__init__()
        self.model = model.model  # its parameters, under the checkpoint's names `model.`; never its forwards
        self.config: SparkConfig = model.config
        config = self.config
        attach_norm_constants(self.model)
        register_rope(self, "rope_sliding", rotary_inv_freq(config, SLIDING), context)
        register_rope(self, "rope_full", rotary_inv_freq(config, FULL), context)

    def _project(self, attn, normed, cos, sin):
        cfg = self.config
        b, p, _ = normed.shape
        q_dim, kv_dim = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
        q, k, v = attn.q_k_v_proj(normed).split([q_dim, kv_dim, kv_dim], dim=-1)
        q = _rope(q.view(b, p, -1, cfg.head_dim).transpose(1, 2), cos, sin)
        k = _rope(k.view(b, p, -1, cfg.head_dim).transpose(1, 2), cos, sin)
        return q, k, v.view(b, p, -1, cfg.head_dim).transpose(1, 2)

    def _attend(self, attn, normed, q, keys, values, mask):
        """GQA by folding each KV head's query group into the query axis (no K/V copies), 3-D bmm
        (XNNPACK delegates it), then the fp32 sigmoid head gate before out_proj."""
        cfg = self.config
        b, heads, p, d = q.shape
        kv, slots = keys.shape[1], keys.shape[2]
        groups = heads // kv
        q = q.reshape(b * kv, groups * p, d)
        scores = torch.bmm(q, keys.reshape(b * kv, slots, d).transpose(1, 2)) * (d**-0.5)
        scores = scores.reshape(b, kv, groups * p, slots) + mask
        probs = torch.softmax(scores, dim=-1).reshape(b * kv, groups * p, slots)
        out = torch.bmm(probs, values.reshape(b * kv, slots, d)).reshape(b, heads, p, d).transpose(1, 2)
        gate = torch.sigmoid(attn.g_proj(normed).float()).to(out.dtype)  # [B, P, H]
        return attn.out_proj((out * gate[..., None]).reshape(b, p, cfg.num_attention_heads * d))

    @staticmethod
    def _mlp(mlp, x):
        return mlp.down_proj(_gelu(mlp.gate_proj(x)) * mlp.up_proj(x))

    def _forward(self, tokens, positions, sliding, full):
        """The layer stack; `sliding(i, k, v)` / `full(i, k, v)` give each layer type its keys,
        values and additive mask from the i-th layer of that type's state and the new k, v."""
        hidden = self.model.embedding(tokens)
        tables = {
            SLIDING: rope_cos_sin(self, "rope_sliding", positions, hidden.dtype),
            FULL: rope_cos_sin(self, "rope_full", positions, hidden.dtype),
        }
        index = {SLIDING: 0, FULL: 0}
        for kind, layer in zip(self.config.layer_types, self.model.layers):
            normed = rms_norm(layer.input_layernorm, hidden)
            q, k, v = self._project(layer.self_attn, normed, *tables[kind])
            keys, values, mask = (sliding if kind == SLIDING else full)(index[kind], k, v)
            index[kind] += 1
            hidden = hidden + self._attend(layer.self_attn, normed, q, keys, values, mask)
            hidden = hidden + self._mlp(layer.mlp, rms_norm(layer.post_attention_layernorm, hidden))
        return F.linear(rms_norm(self.model.norm, hidden), self.model.embedding.weight)  # tied head

    def _grouped(self, valid: torch.Tensor, dtype) -> torch.Tensor:
        """[P, S] visibility -> additive mask laid out for the folded query groups."""
        groups = self.config.num_attention_heads // self.config.num_key_value_heads
        return group_mask(mask_from_valid(valid, dtype)[None, None], groups, valid.shape[0])


class SparkPrefill(_SparkGraph):
    """tokens [1, P] at positions start .. start + P - 1 against the cache state -> logits
    [1, P, vocab], the updated ring, and the full layers' new key/value [Lf, 1, KV, P, D]."""

    def forward(self, tokens, start, ring_key, ring_value, past_key, past_value):
        window, chunk, context = ring_key.shape[3], tokens.shape[1], past_key.shape[3]
        dtype = ring_key.dtype
        offsets = torch.arange(chunk)
        positions = start + offsets
        slots = torch.arange(window)
        # Ring contents before the chunk: slot j holds the latest position < start with p % W == j
        # (negative: never written). Operands are kept non-negative for every runtime's Mod.
        held = (start - 1) - torch.remainder(start - 1 - slots + window, window)
        ring_valid = (held >= 0)[None, :] & (positions[:, None] - held[None, :] < window)
        chunk_valid = causal_valid(chunk, chunk) & (offsets[:, None] - offsets[None, :] < window)
        sliding_mask = self._grouped(torch.cat((ring_valid, chunk_valid), dim=1), dtype)
        past_valid = (torch.arange(context)[None, :] < start).expand(chunk, context)
        full_mask = self._grouped(torch.cat((past_valid, causal_valid(chunk, chunk)), dim=1), dtype)
        # After the chunk, slot j holds the latest position <= end; from the chunk if >= start.
        end = start + chunk - 1
        latest = end - torch.remainder(end - slots + window, window)
        from_chunk = (latest >= start)[:, None]
        row = torch.clamp(latest - start, 0, chunk - 1)
        rings: tuple[list, list] = ([], [])
        news: tuple[list, list] = ([], [])

        def sliding(i, k, v):
            rings[0].append(torch.where(from_chunk, k.index_select(2, row), ring_key[i]))
            rings[1].append(torch.where(from_chunk, v.index_select(2, row), ring_value[i]))
            return torch.cat((ring_key[i], k), dim=2), torch.cat((ring_value[i], v), dim=2), sliding_mask

        def full(i, k, v):
            news[0].append(k)
            news[1].append(v)
            return torch.cat((past_key[i], k), dim=2), torch.cat((past_value[i], v), dim=2), full_mask

        logits = self._forward(tokens, positions, sliding, full)
        return logits, torch.stack(rings[0]), torch.stack(rings[1]), torch.stack(news[0]), torch.stack(news[1])


class SparkDecode(_SparkGraph):
    """One token [1, 1] at `position` [1]: writes its sliding K/V into slot position % W (the slot
    of position - W, which just left the window), attends over the ring and the full cache."""

    def forward(self, token, position, ring_key, ring_value, past_key, past_value):
        window, context = ring_key.shape[3], past_key.shape[3]
        dtype = ring_key.dtype
        slots = torch.arange(window)
        write = (slots == torch.remainder(position, window))[:, None]
        held = position - torch.remainder(position - slots + window, window)  # after the write
        sliding_mask = mask_from_valid(held >= 0, dtype)[None, None, None]
        full_valid = torch.cat((torch.arange(context) < position, torch.ones(1, dtype=torch.bool)))
        full_mask = mask_from_valid(full_valid, dtype)[None, None, None]
        rings: tuple[list, list] = ([], [])
        news: tuple[list, list] = ([], [])

        def sliding(i, k, v):
            keys, values = torch.where(write, k, ring_key[i]), torch.where(write, v, ring_value[i])
            rings[0].append(keys)
            rings[1].append(values)
            return keys, values, sliding_mask

        def full(i, k, v):
            news[0].append(k)
            news[1].append(v)
            return torch.cat((past_key[i], k), dim=2), torch.cat((past_value[i], v), dim=2), full_mask

        logits = self._forward(token, position, sliding, full)
        return logits, torch.stack(rings[0]), torch.stack(rings[1]), torch.stack(news[0]), torch.stack(news[1])


# -- state layout ------------------------------------------------------------------------------
def empty_state(config: SparkConfig, context: int, dtype=torch.float32) -> tuple[torch.Tensor, ...]:
    """Zeroed (ring_key, ring_value, past_key, past_value): the state before position 0."""
    kv, d = config.num_key_value_heads, config.head_dim
    ring = torch.zeros(len(config.sliding_layers), 1, kv, config.sliding_window, d, dtype=dtype)
    past = torch.zeros(len(config.full_layers), 1, kv, context, d, dtype=dtype)
    return ring, ring.clone(), past, past.clone()
