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
    options={
        "context": RecipeOption("full-attention KV slots (tiny 128, 1.7b / checkpoint 1024)"),
        "prefill": RecipeOption("tokens per prefill call (tiny 12, 1.7b / checkpoint 128)"),
    },
    reference_packages=("safetensors",),
)
