"""What `minicpm-o` declares without importing torch: presets, components and their roles.

Components (role):
  tts_prefill (talker)   conditioning embeddings (right-padded chunk) -> audio-token logits, KV
  tts_decode (talker)    one audio token, KV-cached -> logits, its KV
  flow_encoder (decoder) a streaming chunk of 25 + 3 lookahead tokens -> mu (50 frames), conformer caches explicit
  flow_chunk (decoder)   one streaming chunk of the N-step CFM with the DiT's attention / conv caches explicit
  flow_encoder_last (decoder)  the stream's last call (the flush): 1..28 tokens, no lookahead -> mu (2 per token)
  flow_chunk_last (decoder)    the CFM of that last call on its 2..56 frames
  flow_step (decoder)    one classifier-free-guided Euler step of the DiT (batch 2 inside)
  flow (decoder)         the whole N-step cosine-grid Euler loop, CFM noise as an input
  hift (decoder)         mel -> 24 kHz wav; sine-source phase and noise as inputs, STFT/ISTFT as convs
  hift_stream (decoder)  HiFT for every call of a stream, the flush included: up to 64 frames, the real count an input

The model itself is built by `recipe.py`, which the registry imports only once work starts.
"""

from __future__ import annotations

from ..base import ComponentPrecisions, RecipeFacts, RecipeOption
from .presets import PRESETS

# Why ExecuTorch and Core ML build the graphs that unroll the Euler loop only when placed by name.
_UNROLLED = (
    "the Euler loop unrolled (10 steps of the DiT): XNNPACK's lowering of it took 85-114 s a precision at the tiny "
    "preset (ONNX 15-20 s), and at 4.5 both flow_chunk .pte jobs were killed for memory (16.3 and 24.1 GB) still "
    "lowering after 10 minutes; Core ML's conversion took 33-56 s a precision at tiny (flow_step 5-6 s), and at 4.5 "
    "none of its 12 such jobs had finished 14 minutes in (processes of 6.9-12.2 GB), so ExecuTorch and Core ML build "
    "them only when placed by name (--placement flow_chunk=executorch:fp32, flow=coreml:fp16); ONNX Runtime and MNN run "
    "the same graphs on the cpu and mnn targets, and an app on the others loops over flow_step")

ROLES = {
    "tts_prefill": "talker",
    "tts_decode": "talker",
    "flow_encoder": "decoder",
    "flow_chunk": "decoder",
    "flow_encoder_last": "decoder",
    "flow_chunk_last": "decoder",
    "flow_step": "decoder",
    "flow": "decoder",
    "hift": "decoder",
    "hift_stream": "decoder",
}

FACTS = RecipeFacts(
    name="minicpm-o",
    description="MiniCPM-o 4.5 speech output: TTS head (prefill + decode) and Token2wav (flow-matching DiT + HiFT)",
    presets={name: p.description for name, p in PRESETS.items()},
    components=ROLES,
    # The TTS head's 4-bit schemes (tiny preset, seed 0): the scheme alone loses the top-1 token.
    coarse=dict.fromkeys(("tts_prefill", "tts_decode"), {
        "q4_0": "int4 weights alone bring the head logits to 13.9-14.9 dB of fp32 eager (tiny: scheme 13.9 / 14.8 dB, "
                "lowering 37.2 / 37.6 dB), and tts_decode's top-1 token agrees on none of its 3 samples",
        "w4": "int4 weights alone bring the head logits to 12.3-14.6 dB of fp32 eager (tiny: scheme 12.3 / 14.6 dB, "
              "lowering 57.6 / 55.3 dB), and tts_decode's top-1 token agrees on none of its 3 samples",
    }),
    # HiFT's wav is synthesised from a sine source whose phase accumulates F0 to ~1e4 rad per second
    # (ISTFTNet's phase output is free as well), and hift's `source` is that sine source itself, the
    # state the next call's STFT reads: each is judged by its spectrogram, its SNR recorded.
    spectral_outputs={"hift": ("wav", "source"), "hift_stream": ("wav",)},
    placed_precisions={
        # Rounding HiFT's weights to fp16 alone moves the vocoder's F0 and so its sine source's phase.
        **dict.fromkeys(("hift", "hift_stream"), ComponentPrecisions(
            {"*": ("fp32",)},
            "fp32 only: fp16 weights alone move the vocoder's F0 and so the phase of its sine source (tiny: fp16 scheme "
            "5.8 dB, ONNX fp16 4.8 dB, MNN fp16 -2.4 dB against a 30 dB gate; fp32 73.7 dB); -p fp16 builds the variant")),
        # On ExecuTorch and Core ML the non-streaming CFM runs as the app's loop over flow_step; the unrolled graphs by name.
        "flow": ComponentPrecisions({"executorch": (), "coreml": ()}, _UNROLLED),
        # The streaming CFM in fp16 loses more over its 10 steps at the released size than the gate allows.
        **dict.fromkeys(("flow_chunk", "flow_chunk_last"), ComponentPrecisions(
            {"executorch": (), "coreml": (), "onnx": ("fp32",)},
            _UNROLLED + "; ONNX in fp32 only: at 4.5 the fp16 graphs scored 27.7 (flow_chunk, end-to-end) and 27.5 dB "
            "(flow_chunk_last, against the fp16 eager) against the 30 dB gate, where the non-streaming flow's fp16 "
            "scored 34.5 (tiny: 33.3 / 32.8); -p fp16 builds the variant")),
        # On the HTP the head keeps a calibrated w8a16 build beside fp16.
        **dict.fromkeys(("tts_prefill", "tts_decode"), ComponentPrecisions(
            {"qnn": ("fp16", "w8a16")},
            "the TTS head in fp16 and in w8a16 calibrated on eager head states (tiny, HTP simulator: prefill 49.9 / "
            "24.9 dB, decode 51.7 / 28.4 dB)")),
    },
    options={
        "max_context": RecipeOption("KV slots of the TTS head's tts_decode (tiny 64, real presets / checkpoint 512)"),
        "steps": RecipeOption("Euler steps of the `flow` graph (default 10, the official non-streaming count)"),
        "max_prompt": RecipeOption("the longest voice prompt (25 Hz tokens) the streaming graphs take: their caches "
                                   "hold max_prompt + 50 tokens / 2 (max_prompt + 50) frames, any shorter prompt "
                                   "masked (default 150: 6 s)"),
        "frames": RecipeOption("mel frames (50 Hz) per flow / flow_step / hift call (default 50: one 25-token chunk)"),
    },
    reference_packages=("transformers", "minicpmo-utils", "einops", "scipy", "safetensors", "PyYAML"),
)
