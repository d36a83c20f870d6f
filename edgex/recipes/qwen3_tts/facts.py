"""What `qwen3-tts` declares without importing torch: presets, components and their roles.

Components (role):
  talker_prefill (talker)        fixed prompt chunk -> logits, hidden, KV for the cache
  talker_decode (talker)         one KV-cached step per 80 ms frame
  code_predictor (predictor)     the 15 residual codebooks of a frame in one graph
  code_predictor_step (predictor) one predictor position: the fallback runner loop
  code2wav (decoder)             72 context + 25 new frames -> wav of the new frames
  code2latent (decoder)          exact streaming, part 1: codes -> latents, rolling KV
  latent2wav (decoder)           exact streaming, part 2: latents + 12 frames context -> wav

The model itself is built by `recipe.py`, which the registry imports only once work starts.
"""

from __future__ import annotations

from ..base import RecipeFacts
from .presets import PRESETS

ROLES = {
    "talker_prefill": "talker",
    "talker_decode": "talker",
    "code_predictor": "predictor",
    "code_predictor_step": "predictor",
    "code2wav": "decoder",
    "code2latent": "decoder",
    "latent2wav": "decoder",
}

FACTS = RecipeFacts(
    name="qwen3-tts",
    description="Qwen3-TTS 12 Hz: talker (prefill + decode), code predictor, Code2Wav (window + streaming)",
    presets={name: p.description for name, p in PRESETS.items()},
    components=ROLES,
    reference_packages=("transformers", "qwen-tts", "safetensors"),
)
