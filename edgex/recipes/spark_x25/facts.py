"""What `spark-x2.5` declares without importing torch: presets, components, build options.

The model itself is built by `recipe.py`, which the registry imports only once work starts.
"""

from __future__ import annotations

from ..base import RecipeFacts, RecipeOption
from .config import PRESETS

ROLES = {"prefill": "llm", "decode": "llm"}
# docs/models.md: the head-wise gate stays unquantized in every quantized scheme.
FLOAT_ONLY = ("*.self_attn.g_proj",)

FACTS = RecipeFacts(
    name="spark-x2.5",
    description="Spark-X2.5: 3:1 sliding/full attention LLM with a head-wise gate; prefill + decode",
    presets={name: p.description for name, p in PRESETS.items()},
    components=ROLES,
    # Measured on the tiny preset, seed 0, by `scripts/scheme_table.py` (docs/precisions.md): the
    # scheme alone (the file's weights in eager PyTorch) flips the token, the lowering does not.
    coarse={
        "prefill": {"w4": "int4 weights alone flip 19 of 24 prefill top-1 tokens beyond the tie margin, up to 33 x it (tiny: "
                          "scheme 4.7 dB, top-1 0.17; lowering 47.5 dB)"},
        "decode": {"w4": "int4 weights alone flip the decode step's top-1 token beyond the tie margin (tiny: scheme "
                         "6.6 dB, top-1 0.00, margin 0.26 against a tie margin of 0.051; lowering 43.3 dB)"},
    },
    options={
        "max_context": RecipeOption("full-attention KV slots (tiny 128, 1.7b / checkpoint 1024)"),
        "prefill": RecipeOption("tokens per prefill call (tiny 12, 1.7b / checkpoint 128)"),
    },
    reference_packages=("safetensors",),
)
