"""File layouts that a component declares for formats whose runtime dictates the file's contents.

A GGUF file is read by llama.cpp's own architecture code, which expects fixed tensor names,
metadata keys and an input convention per architecture. That is knowledge about the model, so it
lives with the recipe: a component carries a `GgufLayout` under `Component.layouts["gguf"]`, and
the GGUF exporter and the llama.cpp runtime stay free of model names (a new recipe declares its
own layout without touching either).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .gguf_vocab import GgufVocab

# What a component input or output is to llama.cpp (`LlamaFeed`).
# "Full layers" are those in llama.cpp's non-sliding KV cache (all layers of a model without a
# sliding window); "sliding layers" are those in its sliding-window cache, in layer order.
EMBEDS = "embeds"  # float [1, n, H]: the batch's input embeddings
TOKENS = "tokens"  # int [1, n]: the batch's token ids (instead of embeds)
POSITION = "position"  # int [1]: position of the first embedding (= cached tokens)
PAST_KEY = "past_key"  # float [full layers, 1, KV, S, D]: the first `position` slots seed the cache
PAST_VALUE = "past_value"
RING_KEY = "ring_key"  # float [sliding layers, 1, KV, W, D]: position p in slot p % W seeds the window
RING_VALUE = "ring_value"
LOGITS = "logits"  # llama.cpp's logits from `logits_offset` on
HIDDEN = "hidden"  # llama.cpp's post-final-norm hidden state (embeddings output)
KEY = "key"  # the full layers' cache entries this call wrote, read back from llama.cpp's cache
VALUE = "value"
NEXT_RING_KEY = "next_ring_key"  # the ring input with this call's sliding-cache entries written in
NEXT_RING_VALUE = "next_ring_value"
# A speech model's generation graphs that libmtmd runs from an mmproj GGUF (`mtmd_gen_audio_process`):
GEN_HIDDEN = "gen_hidden"  # float [1, 1, H]: the talker's post-norm hidden state of the frame
GEN_CODE0 = "gen_code0"  # int [1, 1]: the frame's codebook-0 code, sampled from the talker
GEN_NOISE = "gen_noise"  # float [1, 15, V]: must be zero: libmtmd samples in its graph, top_k = 1 is greedy
GEN_CODES = "gen_codes"  # int [1, 15]: the residual codes libmtmd sampled
GEN_LOGITS = "gen_logits"  # float [1, 15, V]: each residual codebook's logits, read from libmtmd's graph
CODEC_EMBEDS = "codec_embeds"  # float [1, 1, H]: the sum of the frame's 16 code embeddings
GEN_WAV_CODES = "gen_wav_codes"  # int [1, 16, T]: codes of T frames
GEN_WAV = "gen_wav"  # float [1, 1, T x samples per frame]: libmtmd's waveform of those frames
FEED_INPUTS = (EMBEDS, TOKENS, POSITION, PAST_KEY, PAST_VALUE, RING_KEY, RING_VALUE, GEN_HIDDEN, GEN_CODE0, GEN_NOISE,
               GEN_WAV_CODES)
FEED_OUTPUTS = (LOGITS, HIDDEN, KEY, VALUE, NEXT_RING_KEY, NEXT_RING_VALUE, GEN_CODES, GEN_LOGITS, CODEC_EMBEDS, GEN_WAV)


@dataclass(frozen=True)
class LlamaFeed:
    """How one call of the component maps onto a llama.cpp context, per declared input/output.

    Written into the GGUF (`edgex.feed.*`), so the runtime and `edgex verify` need only the file."""

    inputs: tuple[str, ...]  # one of FEED_INPUTS per component input, in declared order
    outputs: tuple[str, ...]  # one of FEED_OUTPUTS per component output, in declared order
    logits_offset: int = 0  # the component's logits are llama.cpp's logits[..., offset:]
    positions_per_embd: int = 1  # M-RoPE models take this many positions per input embedding
    new_frames: int = 0  # a waveform output keeps the samples of its input's last `new_frames` frames (0: all)


def llm_metadata(arch: str, *, name: str, layers: int, context: int, hidden: int, ffn: int, heads: int,
                 kv_heads: int, head_dim: int, rms_eps: float, vocab: int) -> dict:
    """The hyperparameter keys every llama.cpp transformer architecture reads, under `arch`; a layout
    adds its own keys, and its `vocab` the tokenizer (llama.cpp's `none` vocabulary without one)."""
    return {
        "general.name": name,
        f"{arch}.block_count": layers,
        f"{arch}.context_length": context,
        f"{arch}.embedding_length": hidden,
        f"{arch}.feed_forward_length": ffn,
        f"{arch}.attention.head_count": heads,
        f"{arch}.attention.head_count_kv": kv_heads,
        f"{arch}.attention.key_length": head_dim,
        f"{arch}.attention.value_length": head_dim,
        f"{arch}.attention.layer_norm_rms_epsilon": float(rms_eps),
        f"{arch}.vocab_size": vocab,
    }


@dataclass(frozen=True)
class GgufLayout:
    """Everything a GGUF file holds for one component, in llama.cpp's conventions for `architecture`.

    `metadata` values are typed by their Python type: int -> uint32, float -> float32, bool, str,
    list of int -> int32 array, list of bool -> bool array, list of str -> string array. `tensors()` returns float32 arrays in
    numpy order (a [rows, cols] weight is ggml's ne = [cols, rows]); it is called at export time
    only, so building a large table (a folded embedding) costs nothing until then."""

    architecture: str
    metadata: dict
    tensors: Callable[[], dict[str, np.ndarray]]
    feed: LlamaFeed
    # Tensors kept at F32 whatever the precision (besides 1-D tensors, which always are): e.g.
    # weights whose products overflow half precision.
    keep_f32: tuple[str, ...] = ()
    # name -> "F32" (kept F32), "F16" (F16 at most: never block-quantized) or None (the precision's
    # type): the formats some kernels take (ggml's conv kernels are F16 / F32 only).
    type_rule: Callable[[str], str | None] | None = None
    # The checkpoint's tokenizer and sampling defaults (`edgex.gguf_vocab`); None: llama.cpp's `none`
    # vocabulary, the file runs from token ids or embeddings.
    vocab: GgufVocab | None = None
