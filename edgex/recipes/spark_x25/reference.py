"""The eager reference on the graphs' state layout: rebuild its cache from a graph's inputs, run it
unmodified, and lay its outputs out as the graph's (also: graph state from an eager cache, for samples).

Everything here is reference-side plumbing (index bookkeeping over `SparkCache`); the graphs
(`graphs.py`) import none of it, so the two implementations share no numerical code.
"""

from __future__ import annotations

import torch

from .config import SparkConfig
from .graphs import empty_state
from .model import LayerCache, SparkCache, SparkForCausalLM


def _ring_write(ring: torch.Tensor, layer: LayerCache, keys: torch.Tensor, end: int) -> torch.Tensor:
    """`ring` with the last `window` positions before `end` that `layer` holds put in their slots."""
    window = ring.shape[2]
    positions = torch.arange(max(layer.start, end - window), end)
    out = ring.clone()
    out[:, :, positions % window] = keys[:, :, positions - layer.start]
    return out


def state_from_cache(config: SparkConfig, cache: SparkCache, position: int, context: int) -> tuple[torch.Tensor, ...]:
    """Graph state (ring_key, ring_value, past_key, past_value) holding an eager cache's positions
    < `position` (the eager cache may hold more: it is sliced)."""
    ring_key, ring_value, past_key, past_value = empty_state(config, context)
    if position == 0:
        return ring_key, ring_value, past_key, past_value
    for s, i in enumerate(config.sliding_layers):
        layer = cache.layers[i]
        ring_key[s] = _ring_write(ring_key[s], layer, layer.keys, position)
        ring_value[s] = _ring_write(ring_value[s], layer, layer.values, position)
    for f, i in enumerate(config.full_layers):
        layer = cache.layers[i]
        past_key[f, :, :, :position] = layer.keys[:, :, :position]
        past_value[f, :, :, :position] = layer.values[:, :, :position]
    return ring_key, ring_value, past_key, past_value


def cache_from_state(config: SparkConfig, position: int, ring_key, ring_value, past_key, past_value) -> SparkCache:
    """An eager cache with what the model may see at `position`: the full layers' first `position`
    entries, the sliding layers' last window - 1 positions read from their ring slots."""
    window = config.sliding_window
    cache = SparkCache.empty(config)
    first = max(0, position - (window - 1))
    ring_slots = torch.arange(first, position) % window
    for s, i in enumerate(config.sliding_layers):
        cache.layers[i] = LayerCache(ring_key[s][:, :, ring_slots], ring_value[s][:, :, ring_slots], first)
    for f, i in enumerate(config.full_layers):
        cache.layers[i] = LayerCache(past_key[f][:, :, :position], past_value[f][:, :, :position], 0)
    return cache


@torch.no_grad()
def step_reference(model: SparkForCausalLM, tokens, position, ring_key, ring_value, past_key, past_value):
    """The eager model on a graph's inputs, with its outputs laid out as the graph's."""
    config = model.config
    start, chunk = int(position.reshape(-1)[0]), tokens.shape[1]
    cache = cache_from_state(config, start, ring_key, ring_value, past_key, past_value)
    logits = model(tokens, cache)
    end = start + chunk
    rings_k = [_ring_write(ring_key[s], cache.layers[i], cache.layers[i].keys, end) for s, i in enumerate(config.sliding_layers)]
    rings_v = [_ring_write(ring_value[s], cache.layers[i], cache.layers[i].values, end) for s, i in enumerate(config.sliding_layers)]
    new_k = [cache.layers[i].keys[:, :, start:end] for i in config.full_layers]
    new_v = [cache.layers[i].values[:, :, start:end] for i in config.full_layers]
    return logits, torch.stack(rings_k), torch.stack(rings_v), torch.stack(new_k), torch.stack(new_v)
