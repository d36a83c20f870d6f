"""Talker graphs: prefill over a fixed chunk and one KV-cached decode step.

The KV cache is explicit: `past_key`/`past_value` [layers, 1, kv_heads, max_context, head_dim] are
graph inputs, and each call returns only its new entries, which the runner writes at `position`
(the static-shape pattern ExecuTorch and QNN runners use). The talker's multimodal RoPE reduces to
plain RoPE for speech, where the three position streams are equal.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from ...nn.transformer import (attach_norm_constants, causal_valid, decoder_stack, group_mask, mask_from_valid,
                              register_rope, rope_cos_sin, rope_inv_freq, step_valid)


class _TalkerGraph(nn.Module):
    def __init__(self, talker: nn.Module, positions: int):
        """`positions`: the bound of the positions the graph takes (prefill: its chunk; decode: its KV slots)."""
        super().__init__()
        self.model = talker.model
        self.codec_head = talker.codec_head
        attach_norm_constants(talker)
        register_rope(self, "rope", rope_inv_freq(talker.config), positions)

    def _run(self, embeds, positions, past_key, past_value, mask):
        cos, sin = rope_cos_sin(self, "rope", positions, embeds.dtype)
        hidden, keys, values = decoder_stack(self.model, embeds, cos, sin, past_key, past_value, mask)
        return self.codec_head(hidden), hidden, keys, values


class TalkerPrefill(_TalkerGraph):
    """inputs_embeds [1, P, H] -> logits [1, P, V], hidden [1, P, H], key/value [L, 1, KV, P, D].

    Pad a shorter prompt on the right: causal attention keeps the real positions exact."""

    def forward(self, inputs_embeds):
        seq = inputs_embeds.shape[1]
        positions = torch.arange(seq)
        mask = mask_from_valid(causal_valid(seq, seq), inputs_embeds.dtype)[None, None]
        config = self.model.config
        mask = group_mask(mask, config.num_attention_heads // config.num_key_value_heads, seq)
        return self._run(inputs_embeds, positions, None, None, mask)


class TalkerDecode(_TalkerGraph):
    """One step: inputs_embeds [1, 1, H], position [1] (= number of cached tokens), past key/value.

    Slots >= position are ignored, so the runner need not clear them."""

    def forward(self, inputs_embeds, position, past_key, past_value):
        slots = past_key.shape[3]
        valid = step_valid(slots, position)
        mask = mask_from_valid(valid, inputs_embeds.dtype)[None, None, None]
        return self._run(inputs_embeds, position, past_key, past_value, mask)


def _cache(past_key, past_value, length: int) -> DynamicCache:
    cache = DynamicCache()
    for i in range(past_key.shape[0]):
        cache.update(past_key[i][:, :, :length], past_value[i][:, :, :length], i)
    return cache


@torch.no_grad()
def prefill_reference(talker, inputs_embeds):
    """Unmodified HF talker forward with a DynamicCache."""
    out = talker.model(inputs_embeds=inputs_embeds, use_cache=True)
    cache = out.past_key_values
    layers = range(len(talker.model.layers))
    hidden = out.last_hidden_state
    return (
        talker.codec_head(hidden),
        hidden,
        torch.stack([cache[i][0] for i in layers]),
        torch.stack([cache[i][1] for i in layers]),
    )


@torch.no_grad()
def decode_reference(talker, inputs_embeds, position, past_key, past_value):
    n = int(position.reshape(-1)[0])
    cache = _cache(past_key, past_value, n)
    out = talker.model(
        inputs_embeds=inputs_embeds, past_key_values=cache, use_cache=True, cache_position=torch.tensor([n])
    )
    layers = range(len(talker.model.layers))
    hidden = out.last_hidden_state
    return (
        talker.codec_head(hidden),
        hidden,
        torch.stack([cache[i][0][:, :, n : n + 1] for i in layers]),
        torch.stack([cache[i][1][:, :, n : n + 1] for i in layers]),
    )
