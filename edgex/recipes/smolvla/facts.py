"""What `smolvla` declares without importing torch: presets, components and their roles.

Components (role):
  vision_encoder (vision)  every camera's image (RGB [0, 1], each at its own size) -> its image
                           tokens [1, 64, 960] (the camera's normalization where the config has one,
                           resize-with-pad to 512, SigLIP, pixel-shuffle connector, sqrt(d) scale)
  prefix (prefix)          image tokens of every camera + language tokens / mask + raw state ->
                           per-layer K/V [layers, 1, P, kv_heads, head_dim] and the prefix mask
  action_step (action)     (x_t, t, prefix K/V, mask) -> velocity (normalized action space)
  action_loop (action)     (noise, prefix K/V, mask) -> unnormalized action chunk: every Euler
                           step (dt = -1/steps) in one graph, `--set steps=N`

The language tokens are an input: the robot tokenizes its task once (SmolVLM's tokenizer), no
tokenizer runs in a graph. The model is LeRobot's SmolVLAPolicy, built by `recipe.py`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ...checkpoints import resolve_checkpoint
from ...errors import EdgexError
from .._lerobot import LEROBOT_PACKAGES
from ..base import ComponentPrecisions, RecipeFacts, RecipeOption

ROLES = {"vision_encoder": "vision", "prefix": "prefix", "action_step": "action", "action_loop": "action"}

# SmolVLM2-500M's configuration (the VLM SmolVLA-450M cuts to its first 16 text layers), written
# here so building never looks anything up on the hub (docs/models.md).
SMOLVLM2_500M = {
    "text": {"hidden_size": 960, "intermediate_size": 2560, "num_attention_heads": 15, "num_key_value_heads": 5,
             "num_hidden_layers": 32, "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
             "vocab_size": 49280, "max_position_embeddings": 8192, "hidden_act": "silu"},
    "vision": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
               "patch_size": 16, "image_size": 512, "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh"},
    "scale_factor": 4,
}

PRESETS = {
    "tiny": {
        "description": "tests and demo: SigLIP 2 layers at 64 px (48x64 cameras padded), 4 text layers width 64, expert 0.75x, chunk 8, 2 cameras",
        "cameras": {"observation.images.top": (3, 48, 64), "observation.images.wrist": (3, 48, 64)},
        "state_dim": 6, "action_dim": 6,
        "vlm": {"text": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "num_hidden_layers": 4, "head_dim": 16, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
                         "vocab_size": 256, "max_position_embeddings": 512, "hidden_act": "silu"},
                "vision": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                           "patch_size": 8, "image_size": 64, "layer_norm_eps": 1e-6, "hidden_act": "gelu_pytorch_tanh"},
                "scale_factor": 2},
        "config": {"chunk_size": 8, "n_action_steps": 8, "max_state_dim": 8, "max_action_dim": 8,
                   "resize_imgs_with_padding": (64, 64), "tokenizer_max_length": 6, "num_vlm_layers": 4, "num_steps": 4},
    },
    "450m": {
        "description": "published SmolVLA-450M: SigLIP at 512 px, 16 SmolVLM2 layers (960), expert 0.75x, chunk 50, dims 32, 10 steps",
        "cameras": {"observation.images.top": (3, 480, 640)}, "state_dim": 6, "action_dim": 6,
        "vlm": SMOLVLM2_500M,
        "config": {"tokenizer_max_length": 48},
    },
}

def vlm_config_inputs(checkpoint: Path) -> dict[str, str | None]:
    """The SmolVLM config a checkpoint's `vlm_model_name` names (a folder, or a hub id in the local
    cache): the model is built from it (`recipe.vlm_config_from`) and it lies outside the checkpoint
    folder, so its sha256 joins the key. A name absent from config.json is LeRobot's default, whose
    version is in the key already; a config that cannot be found or read is None (loading says why)."""
    try:
        name = json.loads((Path(checkpoint) / "config.json").read_text()).get("vlm_model_name")
    except (OSError, ValueError, AttributeError):
        return {"vlm_model_name": None, "vlm_config_sha256": None}
    if not isinstance(name, str):
        return {"vlm_model_name": None, "vlm_config_sha256": None}
    try:
        config = resolve_checkpoint(name) / "config.json"
        digest = hashlib.sha256(config.read_bytes()).hexdigest()
    except (EdgexError, OSError):
        digest = None
    return {"vlm_model_name": name, "vlm_config_sha256": digest}


# The unrolled Euler loop is built for ExecuTorch, the HTP and Core ML only when placed by name
# (--placement action_loop=EXPORTER:PRECISION): an app there loops over action_step. At 450m (10
# steps) XNNPACK's lowering of the unrolled loop held 13-16 GB a precision: the fp32 job was killed
# for memory beside the fp16 one, which was still lowering after 12 minutes; the HTP's fp16 and
# w8a16 jobs of the loop were still running 25 minutes into the export; on Core ML the fp32 loop
# ended 15 minutes into the export and the fp16 one was still running at 20.
ACTION_LOOP = ComponentPrecisions(
    {"executorch": (), "qnn": (), "coreml": ()},
    "ExecuTorch, the HTP and Core ML run the Euler loop as the app's loop over action_step; at 450m the unrolled "
    "loop's XNNPACK lowering holds 13-16 GB a precision and ran past 12 minutes, its HTP jobs past 25 and its Core "
    "ML fp16 job past 20, so it is built there only when placed by name (--placement action_loop=executorch:fp32, "
    "action_loop=qnn:fp16, action_loop=coreml:fp16)")


FACTS = RecipeFacts(
    name="smolvla",
    description="SmolVLA (LeRobot): SmolVLM vision + prefix K/V, cross-attending flow-matching action expert",
    presets={name: p["description"] for name, p in PRESETS.items()},
    components=ROLES,
    options={"steps": RecipeOption("Euler steps baked into action_loop (default: the config's num_steps, 10)")},
    reference_packages=LEROBOT_PACKAGES + ("transformers",),
    external_inputs=vlm_config_inputs,
    # action_step computes the sin / cos embedding of its time input t (periods 4e-3 .. 4, phases up
    # to 1571 t rad), which fp16 arithmetic does not resolve; action_loop, whose times are fixed,
    # bakes the embeddings and runs fp16.
    placed_precisions={"action_step": ComponentPrecisions(
        {"qnn": ("w8a16",), "mnn": ("fp32",), "coreml": ("fp32",)},
        "its sin / cos time embedding is lost in fp16 arithmetic (tiny): in the HTP's fp16 the phase is off by up to "
        "~0.8 rad, the embedding alone scores 19-34 dB and the velocity 29.6 dB, below the 30 dB fp16 lowering gate, so "
        "the HTP builds w8a16 (16-bit activations resolve t); MNN fp16 lowering 18.2 dB (torch fp16 61.6, the loop with "
        "baked embeddings 65.3); Core ML fp16 29.2 dB (lowering 29.3, scheme 61.6, MIL interpreter), fp32 103.5 dB. "
        "--placement action_step=EXPORTER:fp16 builds the fp16 variant"),
        "action_loop": ACTION_LOOP},
)
