"""The talker in llama.cpp's `qwen3tts` GGUF layout (its converter's `Qwen3TTSTalkerModel`).

llama.cpp runs the talker as a Qwen3-VL text graph: RMSNorm, q/k RMSNorm, SiLU-gated FFN and
interleaved M-RoPE. Its conventions, followed here so that libllama loads the file:
  * `token_embd` = the text embedding with `text_projection` folded into every row, then the 3072
    codec embedding rows (codec id c is token `text_vocab + c`);
  * `output` = `codec_head` (3072 rows: llama.cpp hard-codes that width and pads the logits' text
    part with -inf, so the codec logits start at `text_vocab`);
  * `rope.dimension_sections` = `mrope_section` padded to 4 entries.
A checkpoint that ships its text tokenizer gets it in the file as llama.cpp's converter writes it
(`edgex.gguf_vocab`), the codec rows named as the converter names them (`codec_token_names`), with
the sampling defaults of its generation_config.json. Presets (random text ids) keep llama.cpp's `none`
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


def codec_token_names(talker_config: dict, rows: int) -> list[str]:
    """The codec rows' token names as llama.cpp's converter writes them (`Qwen3TTSTalkerModel.
    _codec_token_names`): `<|codec_<i>|>` for row i, then every `talker_config` key ending in `_id`
    names its row: an int `<key>_id` as `<|<key>|>` (`codec_bos_id` -> `<|codec_bos|>`), a table
    `<key>_id: {name: row}` as `<|<key>_<name>|>` (`<|codec_language_english|>`, `<|spk_vivian|>`).
    llama.cpp's TTS tools find the control rows by these names."""
    names = [f"<|codec_{i}|>" for i in range(rows)]
    for key, value in talker_config.items():
        if not key.endswith("_id"):
            continue
        prefix = key[: -len("_id")]
        if isinstance(value, int):
            names[value] = f"<|{prefix}|>"
        elif isinstance(value, dict):
            for name, row in value.items():
                names[row] = f"<|{prefix}_{name}|>"
    return names


def _checkpoint_talker_config(folder: Path) -> dict:
    """The raw `talker_config` of the checkpoint's config.json (the converter reads the file, not
    the config class, whose defaults add keys the file does not hold)."""
    import json

    return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("talker_config") or {}


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
    folder = checkpoint and Path(checkpoint)
    names = codec_token_names(_checkpoint_talker_config(folder), codec_rows) if folder and (folder / "config.json").is_file() else ()
    vocab = checkpoint_vocab(folder, text_vocab + codec_rows, names)
    return GgufLayout(ARCH, meta, lambda: talker_tensors(talker), feed, vocab=vocab)
