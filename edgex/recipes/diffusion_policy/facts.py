"""What `diffusion-policy` declares without importing torch: presets, components and their roles.

Components (role):
  vision_encoder (vision)  every camera's image (RGB [0, 1]) -> the cameras' features side by side,
                           each camera normalized with its own statistics; run per observation step,
                           the runner keeps the last n_obs_steps
  denoise_step (action)    (x_t, timestep, global conditioning) -> U-Net prediction (normalized space)
  action_loop (action)     (raw state history, image features, initial noise) -> unnormalized
                           actions: every DDIM step (eta 0) in one graph, `--set steps=N`

LeRobot's default DDPM sampler adds fresh noise at every step; edgex runs the checkpoint's U-Net
with DDIM (eta 0), the scheduler LeRobot offers for the same weights, so the loop is deterministic
given its initial noise. The eager reference is switched to DDIM with the same step count.
"""

from __future__ import annotations

from .._lerobot import LEROBOT_PACKAGES
from ..base import ComponentPrecisions, RecipeFacts, RecipeOption

ROLES = {"vision_encoder": "vision", "denoise_step": "action", "action_loop": "action"}
DEFAULT_STEPS = 10  # published presets and checkpoints; tiny bakes 4 (export time of the unrolled loop)

PRESETS = {
    "tiny": {
        "description": "tests and demo: ResNet18 (GroupNorm) at 48x48 cropped to 40x40, U-Net (16, 32), horizon 8, 2-DoF",
        "cameras": {"observation.image": (3, 48, 48)}, "state_dim": 2, "action_dim": 2,
        "config": {"crop_shape": (40, 40), "down_dims": (16, 32), "kernel_size": 3, "n_groups": 4,
                   "diffusion_step_embed_dim": 16, "spatial_softmax_num_keypoints": 8, "horizon": 8,
                   "n_action_steps": 4, "n_obs_steps": 2},
        "steps": 4,
    },
    "pusht": {
        "description": "published Diffusion Policy (PushT): ResNet18 at 96x96 cropped to 84x84, U-Net (512, 1024, 2048), horizon 16, 263M",
        "cameras": {"observation.image": (3, 96, 96)}, "state_dim": 2, "action_dim": 2,
        "config": {"crop_shape": (84, 84)},
    },
}

# The unrolled loop is built only when placed by name (--placement action_loop=EXPORTER:PRECISION):
# ExecuTorch and the HTP run the loop as the app's own loop over denoise_step. At the published size
# (pusht, 10 steps) the unrolled loop's XNNPACK build took 758 s and 10.1 GB at fp32, 856 s at fp16,
# which then scored 26.7 dB end-to-end against the 30 dB gate as XNNPACK's fp16 arithmetic compounds
# over the steps (scheme 57.3 dB, denoise_step alone 36.8 dB; ONNX fp16 53.5 dB); its HTP fp16 job
# took 800 s (the unrolled graph's ONNX export and HTP compile 477 s) and its w8a16 graph, ONNX
# Runtime's static QDQ quantization of the unrolled loop, was still quantizing after 22 minutes.
ACTION_LOOP = ComponentPrecisions(
    {"executorch": (), "qnn": ()},
    "ExecuTorch and the HTP run the DDIM loop as the app's loop over denoise_step; at pusht the unrolled loop's "
    "XNNPACK build takes 13 minutes and 10 GB and its fp16 arithmetic compounds over the steps (26.7 dB against "
    "the 30 dB gate), its HTP fp16 job 13 minutes and its w8a16 quantization over 22, so it is built there only "
    "when placed by name (--placement action_loop=executorch:fp32, action_loop=qnn:fp16)")

FACTS = RecipeFacts(
    name="diffusion-policy",
    description="Diffusion Policy (LeRobot): ResNet18 vision encoder + conditional 1-D U-Net, DDIM loop in one graph",
    presets={name: p["description"] for name, p in PRESETS.items()},
    components=ROLES,
    options={"steps": RecipeOption(f"DDIM steps baked into action_loop (default {DEFAULT_STEPS}, tiny 4)")},
    reference_packages=LEROBOT_PACKAGES + ("torchvision", "diffusers"),
    placed_precisions={"action_loop": ACTION_LOOP},
)
