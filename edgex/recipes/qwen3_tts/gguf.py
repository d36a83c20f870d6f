"""The talker in llama.cpp's `qwen3tts` GGUF layout (its converter's `Qwen3TTSTalkerModel`).

llama.cpp runs the talker as a Qwen3-VL text graph: RMSNorm, q/k RMSNorm, SiLU-gated FFN and
interleaved M-RoPE. Its conventions, followed here so that libllama loads the file:
  * `token_embd` = the text embedding with `text_projection` folded into every row, then the 3072
    codec embedding rows (codec id c is token `text_vocab + c`);
  * `output` = `codec_head` (3072 rows: llama.cpp hard-codes that width and pads the logits' text
    part with -inf, so the codec logits start at `text_vocab`);
  * `rope.dimension_sections` = `mrope_section` padded to 4 entries.
A checkpoint that ships its text tokenizer gets it in the file as llama.cpp's converter writes it
(`edgex.gguf_vocab`; the codec rows past the text vocabulary are `[PAD<id>]`), with the sampling
defaults of its generation_config.json. Presets (random text ids) keep llama.cpp's `none`
vocabulary: the file runs from embeddings or token ids, without token names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ...gguf_vocab import checkpoint_vocab
from ...layouts import EMBEDS, HIDDEN, KEY, LOGITS, PAST_KEY, PAST_VALUE, POSITION, VALUE, GgufLayout, LlamaFeed, llm_metadata

ARCH = "qwen3tts"
CODEC_ROWS = 3072  # llama.cpp's `n_vocab_out` for qwen3tts (TAG_LLAMA_N_VOCAB_OUT)
ROPE_SECTIONS = 4  # llama.cpp reads exactly 4 M-RoPE sections
POSITIONS_PER_EMBD = 4  # M-RoPE: an embedding batch carries 4 position streams

# HF names under `talker.model.layers.N.` -> llama.cpp names under `blk.N.`
_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}

PREFILL_FEED = (EMBEDS,)
DECODE_FEED = (EMBEDS, POSITION, PAST_KEY, PAST_VALUE)
TALKER_OUTPUTS = (LOGITS, HIDDEN, KEY, VALUE)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy()


@torch.no_grad()
def talker_tensors(talker) -> dict[str, np.ndarray]:
    """GGUF name -> float32 weight, folded and renamed as llama.cpp's converter does."""
    model = talker.model
    text_rows = talker.text_projection(model.text_embedding.weight)
    tensors = {
        "token_embd.weight": _np(torch.cat((text_rows, model.codec_embedding.weight), dim=0)),
        "output_norm.weight": _np(model.norm.weight),
        "output.weight": _np(talker.codec_head.weight),
    }
    for i, layer in enumerate(model.layers):
        modules = dict(layer.named_modules())
        for hf, gg in _LAYER.items():
            tensors[f"blk.{i}.{gg}.weight"] = _np(modules[hf].weight)
    return tensors


def talker_layout(talker, feed_inputs: tuple[str, ...], checkpoint: str | None = None) -> GgufLayout:
    """The talker as one `qwen3tts` GGUF; `feed_inputs` names what each component input is, and the
    checkpoint folder (None for presets) brings its tokenizer."""
    cfg = talker.config
    text_vocab = talker.model.text_embedding.num_embeddings
    codec_rows = talker.codec_head.out_features
    if codec_rows != CODEC_ROWS:
        raise ValueError(f"llama.cpp's qwen3tts graph needs a {CODEC_ROWS}-row codec head, this talker has {codec_rows}")
    sections = list(cfg.rope_scaling["mrope_section"])
    sections += [0] * (ROPE_SECTIONS - len(sections))
    meta = llm_metadata(
        ARCH, name="qwen3-tts talker (edgex)", layers=cfg.num_hidden_layers, context=cfg.max_position_embeddings,
        hidden=cfg.hidden_size, ffn=cfg.intermediate_size, heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim, rms_eps=cfg.rms_norm_eps, vocab=text_vocab + codec_rows,
    )
    meta |= {f"{ARCH}.rope.dimension_sections": sections, f"{ARCH}.rope.freq_base": float(cfg.rope_theta)}
    feed = LlamaFeed(feed_inputs, TALKER_OUTPUTS, logits_offset=text_vocab, positions_per_embd=POSITIONS_PER_EMBD)
    vocab = checkpoint_vocab(checkpoint and Path(checkpoint), text_vocab + codec_rows)
    return GgufLayout(ARCH, meta, lambda: talker_tensors(talker), feed, vocab=vocab)
