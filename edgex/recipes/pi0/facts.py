"""What `pi0` declares without importing torch: presets, sizes, components and their roles.

Components (role):
  vision_encoder (vision)  every camera's image (RGB [0, 1], each at its own size) -> its image
                           tokens [1, 256, 2048] (the camera's normalization where the config has one,
                           LeRobot's resize-with-pad to 224, [-1, 1], SigLIP So400m, linear projector)
  prefix (prefix)          image tokens of every camera + language tokens / mask -> per-layer K/V
                           [layers, 1, P, kv_heads, head_dim] of the PaliGemma Gemma-2B (after RoPE)
                           and the prefix mask
  action_step (action)     (x_t, t, raw state, prefix K/V, mask) -> velocity (normalized action space)
                           from the Gemma action expert (state token + chunk action tokens)
  action_loop (action)     (noise, raw state, prefix K/V, mask) -> unnormalized action chunk: every
                           Euler step (dt = -1/steps) in one graph, `--set steps=N` (pi0: 10)

pi0 keeps the robot state out of the prefix (pi0.5 puts it there): it is a token of the expert's
suffix, so both action graphs take it. The language tokens are an input (PaliGemma's tokenizer
runs once per task on the robot). The model is edgex's own (`model.py`): LeRobot 0.4.4's pi0 needs a
transformers fork that cannot be installed here.
"""

from __future__ import annotations

from .._lerobot import LEROBOT_PACKAGES
from ..base import ComponentPrecisions, RecipeFacts, RecipeOption

ROLES = {"vision_encoder": "vision", "prefix": "prefix", "action_step": "action", "action_loop": "action"}

# openpi's Gemma variants as LeRobot's config names them (`paligemma_variant`, `action_expert_variant`).
GEMMA_VARIANTS = {
    "gemma_2b": {"width": 2048, "depth": 18, "mlp_dim": 16384, "num_heads": 8, "num_kv_heads": 1, "head_dim": 256},
    "gemma_300m": {"width": 1024, "depth": 18, "mlp_dim": 4096, "num_heads": 8, "num_kv_heads": 1, "head_dim": 256},
}
# PaliGemma-3B's SigLIP So400m/14 (LeRobot sets the MLP width 4304; the image size is the config's)
SIGLIP_SO400M = {"hidden_size": 1152, "intermediate_size": 4304, "num_hidden_layers": 27, "num_attention_heads": 16,
                 "patch_size": 14}
PALIGEMMA_VOCAB = 257152

PRESETS = {
    "tiny": {
        "description": "tests and demo: SigLIP 2 layers at 56 px (48x64 cameras padded), Gemma 2 layers width 64, expert width 32, chunk 8, 2 cameras",
        "cameras": {"observation.images.top": (3, 48, 64), "observation.images.wrist": (3, 48, 64)},
        "state_dim": 6, "action_dim": 6,
        "siglip": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "patch_size": 14},
        "vlm": {"width": 64, "depth": 2, "mlp_dim": 128, "num_heads": 4, "num_kv_heads": 1, "head_dim": 16},
        "expert": {"width": 32, "depth": 2, "mlp_dim": 64, "num_heads": 4, "num_kv_heads": 1, "head_dim": 16},
        "vocab_size": 128,
        "config": {"chunk_size": 8, "n_action_steps": 8, "max_state_dim": 8, "max_action_dim": 8,
                   "image_resolution": (56, 56), "tokenizer_max_length": 6, "num_inference_steps": 10},
    },
    "3.3b": {
        "description": "published pi0 (lerobot/pi0_base): SigLIP So400m at 224 px, Gemma-2B (18 x 2048), expert 18 x 1024, chunk 50, dims 32, 10 steps, 3 cameras",
        "cameras": {f"observation.images.{c}": (3, 224, 224) for c in ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")},
        "state_dim": 14, "action_dim": 14,
        "siglip": SIGLIP_SO400M,
        "vlm": GEMMA_VARIANTS["gemma_2b"],
        "expert": GEMMA_VARIANTS["gemma_300m"],
        "vocab_size": PALIGEMMA_VOCAB,
        "config": {},
    },
}

FACTS = RecipeFacts(
    name="pi0",
    description="pi0 (Physical Intelligence, LeRobot layout): PaliGemma prefix K/V + Gemma flow-matching action expert",
    presets={name: p["description"] for name, p in PRESETS.items()},
    components=ROLES,
    options={"steps": RecipeOption("Euler steps baked into action_loop (default: the config's num_inference_steps, 10)")},
    fp32_components=dict.fromkeys(("action_step", "action_loop"), (
        "the Gemma action expert's velocity loses the chunk below fp32 on accelerators (docs/models.md: an fp16 "
        "TensorRT pi0 loop scored cosine -0.55 until kept in fp32). HTP simulator, tiny: action_loop fp16 lowering "
        "19.2 and 38.3 dB in two builds of the same graph (gate 30), w8a16 11.6 dB (lowering "
        "12.0 / 12); "
        "action_step w8a16 6.5 dB (scheme 9.9)")),
    reference_packages=LEROBOT_PACKAGES + ("transformers",),
    # The velocity step alone keeps no fp16 build on MNN or Core ML (where its role's placement
    # builds fp32 beside fp16); the HTP, fp16 or quantized only, sends it to its fp32 placement.
    placed_precisions={"action_step": ComponentPrecisions(
        {"mnn": ("fp32",), "coreml": ("fp32",)},
        "fp32 only: the Gemma action expert's velocity loses the chunk below fp32 (its fp32_components); "
        "--placement action_step=EXPORTER:fp16 builds the fp16 variant"),
        # the unrolled loop on ExecuTorch and Core ML only when placed by name, as SmolVLA's: the
        # app loops over action_step, and pi0's Gemma action expert is larger than SmolVLA's
        "action_loop": ComponentPrecisions(
            {"executorch": (), "coreml": ()},
            "ExecuTorch and Core ML run the Euler loop as the app's loop over action_step: for SmolVLA 450m's smaller "
            "action expert the unrolled loop's XNNPACK lowering held 13-16 GB a precision and its Core ML fp16 job ran "
            "past 20 minutes, so it is built there only when placed by name (--placement action_loop=executorch:fp32, "
            "action_loop=coreml:fp32)")},
)
