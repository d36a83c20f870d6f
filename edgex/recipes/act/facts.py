"""What `act` declares without importing torch: presets, components and their roles.

Components (role):
  policy (action)   raw observation (state + one image per camera) -> unnormalized action chunk

ACT is deterministic at inference (VAE latent zero): one pass, no noise. The model is LeRobot's
ACTPolicy, built by `recipe.py` only once work starts.
"""

from __future__ import annotations

from .._lerobot import LEROBOT_PACKAGES
from ..base import RecipeFacts

ROLES = {"policy": "action"}

# LeRobot ACTConfig keyword arguments per preset, plus the observation layout.
PRESETS = {
    "tiny": {
        "description": "tests and demo: ResNet18 at 64x64, 1 camera, dim 32, 1+1 layers, chunk 10, 6-DoF",
        "cameras": {"observation.images.top": (3, 64, 64)}, "state_dim": 6, "action_dim": 6,
        "config": {"chunk_size": 10, "n_action_steps": 10, "dim_model": 32, "n_heads": 4, "dim_feedforward": 64,
                   "n_encoder_layers": 1, "n_decoder_layers": 1, "n_vae_encoder_layers": 1, "latent_dim": 8},
    },
    "aloha": {
        "description": "published ACT (ALOHA sim transfer-cube): ResNet18, 480x640 top camera, dim 512, 4+1 layers, chunk 100, 14-DoF, 52M",
        "cameras": {"observation.images.top": (3, 480, 640)}, "state_dim": 14, "action_dim": 14,
        "config": {"chunk_size": 100, "n_action_steps": 100},
    },
}

FACTS = RecipeFacts(
    name="act",
    description="ACT (LeRobot): ResNet18 + transformer encoder/decoder, observation -> action chunk in one graph",
    presets={name: p["description"] for name, p in PRESETS.items()},
    components=ROLES,
    reference_packages=LEROBOT_PACKAGES + ("torchvision",),
)
