"""What `minicpm-o` declares without importing torch: presets, components and their roles.

Components (role):
  tts_prefill (talker)   conditioning embeddings (right-padded chunk) -> audio-token logits, KV
  tts_decode (talker)    one audio token, KV-cached -> logits, its KV
  flow_encoder (decoder) a streaming chunk of 25 + 3 lookahead tokens -> mu (50 frames), conformer caches explicit
  flow_chunk (decoder)   one streaming chunk of the N-step CFM with the DiT's attention / conv caches explicit
  flow_step (decoder)    one classifier-free-guided Euler step of the DiT (batch 2 inside)
  flow (decoder)         the whole N-step cosine-grid Euler loop, CFM noise as an input
  hift (decoder)         mel -> 24 kHz wav; sine-source phase and noise as inputs, STFT/ISTFT as convs

The model itself is built by `recipe.py`, which the registry imports only once work starts.
"""

from __future__ import annotations

from ..base import RecipeFacts, RecipeOption
from .presets import PRESETS

ROLES = {
    "tts_prefill": "talker",
    "tts_decode": "talker",
    "flow_encoder": "decoder",
    "flow_chunk": "decoder",
    "flow_step": "decoder",
    "flow": "decoder",
    "hift": "decoder",
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
    # (ISTFTNet's phase output is free as well), and `source` is that sine source itself, the state
    # the next call's STFT reads: both are judged by their spectrograms, their SNRs recorded.
    spectral_outputs={"hift": ("wav", "source")},
    options={
        "steps": RecipeOption("Euler steps of the `flow` graph (default 10, the official non-streaming count)"),
        "prompt": RecipeOption("prompt tokens the streaming encoder's caches hold (flow_encoder: prompt + 50 "
                               "25 Hz rows; default 10)"),
        "frames": RecipeOption("mel frames (50 Hz) per flow / flow_step / hift call (default 50: one 25-token chunk)"),
    },
    reference_packages=("transformers", "minicpmo-utils", "einops", "scipy", "safetensors", "PyYAML"),
)
