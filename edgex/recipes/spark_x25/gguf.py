"""Spark-X2.5 in llama.cpp's own `spark2_5` GGUF layout (its converter's `Spark2_5Model`).

llama.cpp runs this architecture natively (`src/models/spark2-5.cpp`): a fused `attn_qkv` in q, k, v
row order, the head-wise `attn_gate` (sigmoid, one scale per head), NeoX RoPE with per-layer-type
base and rotary width (`rope.freq_base` / `rope.dimension_count` for full layers,
`*_swa` for sliding ones), a standard sliding window that includes the current token, and the
embedding tied as the output. Its FFN uses ggml's tanh-approximate GELU where the reference uses
the exact one, so llama.cpp's parity carries that small gap (docs/models.md).

The graphs' state maps onto llama.cpp's two caches: the ring feeds its sliding-window cache, the
full layers' past K/V its non-sliding cache. A checkpoint that ships its tokenizer gets it in the
file as llama.cpp's converter writes it (`edgex.gguf_vocab`), with the sampling defaults of its
generation_config.json; presets (random token ids) keep llama.cpp's `none` vocabulary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ...gguf_vocab import checkpoint_vocab
from ...layouts import (
    KEY, LOGITS, NEXT_RING_KEY, NEXT_RING_VALUE, PAST_KEY, PAST_VALUE, POSITION, RING_KEY, RING_VALUE, TOKENS,
    VALUE, GgufLayout, LlamaFeed, llm_metadata,
)
from .config import SLIDING
from .model import SparkForCausalLM

ARCH = "spark2_5"
FEED = LlamaFeed(
    (TOKENS, POSITION, RING_KEY, RING_VALUE, PAST_KEY, PAST_VALUE),
    (LOGITS, NEXT_RING_KEY, NEXT_RING_VALUE, KEY, VALUE),
)

# reference names under `model.layers.N.` -> llama.cpp names under `blk.N.`
_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_k_v_proj": "attn_qkv",
    "self_attn.g_proj": "attn_gate",
    "self_attn.out_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


@torch.no_grad()
def spark_tensors(model: SparkForCausalLM) -> dict[str, np.ndarray]:
    """GGUF name -> float32 weight; the output is tied to `token_embd`, so it is not stored."""
    inner = model.model
    tensors = {
        "token_embd.weight": inner.embedding.weight.float().numpy(),
        "output_norm.weight": inner.norm.weight.float().numpy(),
    }
    for i, layer in enumerate(inner.layers):
        modules = dict(layer.named_modules())
        for ours, theirs in _LAYER.items():
            tensors[f"blk.{i}.{theirs}.weight"] = modules[ours].weight.float().numpy()
    return tensors


def spark_layout(model: SparkForCausalLM, context: int, checkpoint: str | None = None) -> GgufLayout:
    """The whole model as one `spark2_5` GGUF; the prefill and decode graphs share it. The
    checkpoint folder (None for presets) brings its tokenizer."""
    cfg = model.config
    meta = llm_metadata(
        ARCH, name="spark-x2.5 (edgex)", layers=cfg.num_hidden_layers, context=context, hidden=cfg.hidden_size,
        ffn=cfg.intermediate_size, heads=cfg.num_attention_heads, kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim, rms_eps=cfg.rms_norm_eps, vocab=cfg.vocab_size,
    )
    meta |= {
        f"{ARCH}.attention.sliding_window": cfg.sliding_window,
        f"{ARCH}.attention.sliding_window_pattern": [t == SLIDING for t in cfg.layer_types],
        f"{ARCH}.rope.freq_base": float(cfg.full_rope_theta),
        f"{ARCH}.rope.freq_base_swa": float(cfg.sliding_rope_theta),
        f"{ARCH}.rope.dimension_count": int(cfg.head_dim * cfg.full_partial_rotary_factor),
        f"{ARCH}.rope.dimension_count_swa": cfg.head_dim,
    }
    gates = tuple(f"blk.{i}.attn_gate.weight" for i in range(cfg.num_hidden_layers))  # docs/models.md: never quantized
    vocab = checkpoint_vocab(checkpoint and Path(checkpoint), cfg.vocab_size)
    return GgufLayout(ARCH, meta, lambda: spark_tensors(model), FEED, keep_f32=gates, vocab=vocab)
