"""The TTS head's Llama backbone in llama.cpp's `qwen2` GGUF layout, fed embeddings.

llama.cpp's `llama` architecture applies RoPE to interleaved pairs, so its converter permutes the
q/k projection rows: the cached keys would then be in another order than the reference's. Its
`qwen2` architecture is the same decoder (RMSNorm, SiLU-gated FFN, GQA) with NeoX rotate-half RoPE,
the head's own convention, but requires q/k/v biases: they are written as zeros, which is exact.
  * `token_embd` = `emb_code.0` (6562 audio-token rows): the decode step's input is an audio
    token's embedding, so the file also runs from audio-token ids; the prefill is fed the
    conditioning embeddings (text + projected LLM hidden, eos, bos) as an embedding batch;
  * `output` = `head_code.0` with its weight norm folded (g v / ||v||);
  * RoPE base 10000 and RMSNorm eps 1e-6: the LlamaConfig defaults the official head is built with.
edgex ships no tokenizer: the vocabulary is llama.cpp's `none` model with 6562 placeholder tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from ...layouts import EMBEDS, KEY, LOGITS, PAST_KEY, PAST_VALUE, POSITION, VALUE, GgufLayout, LlamaFeed, llm_metadata
from .tts import MiniCPMTTSHead

ARCH = "qwen2"
PREFILL_FEED = LlamaFeed((EMBEDS,), (LOGITS, KEY, VALUE))
DECODE_FEED = LlamaFeed((EMBEDS, POSITION, PAST_KEY, PAST_VALUE), (LOGITS, KEY, VALUE))

# HF names under `model.layers.N.` -> llama.cpp names under `blk.N.`
_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy()


@torch.no_grad()
def head_tensors(head: MiniCPMTTSHead) -> dict[str, np.ndarray]:
    model = head.model
    tensors = {
        "token_embd.weight": _np(head.emb_code[0].weight),
        "output_norm.weight": _np(model.norm.weight),
        "output.weight": _np(head.output_weight()),
    }
    for i, layer in enumerate(model.layers):
        modules = dict(layer.named_modules())
        for hf, gg in _LAYER.items():
            tensors[f"blk.{i}.{gg}.weight"] = _np(modules[hf].weight)
        for proj in "qkv":
            tensors[f"blk.{i}.attn_{proj}.bias"] = np.zeros(modules[f"self_attn.{proj}_proj"].out_features, np.float32)
    return tensors


def head_layout(head: MiniCPMTTSHead, feed: LlamaFeed) -> GgufLayout:
    cfg = head.backbone_config
    meta = llm_metadata(
        ARCH, name="minicpm-o tts head (edgex)", layers=cfg.num_hidden_layers, context=cfg.max_position_embeddings,
        hidden=cfg.hidden_size, ffn=cfg.intermediate_size, heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads, head_dim=cfg.hidden_size // cfg.num_attention_heads,
        rms_eps=cfg.rms_norm_eps, vocab=head.emb_code[0].num_embeddings,
    )
    meta[f"{ARCH}.rope.freq_base"] = float(cfg.rope_theta)
    return GgufLayout(ARCH, meta, lambda: head_tensors(head), feed)
