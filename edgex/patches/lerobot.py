"""LeRobot: private steps of a policy's own inference path, called for the reference they compute.

This module is light: LeRobot is imported by the recipes.
"""

from __future__ import annotations

from .registry import READ, register


@register("lerobot.diffusion_global_conditioning", kind=READ, checked={"lerobot": "0.4.4"},
          symbols=("lerobot.policies.diffusion.modeling_diffusion.DiffusionModel._prepare_global_conditioning",),
          saves="the vision graph's reference: the U-Net's global conditioning computed by LeRobot's own code "
                "from the cameras and the state, as `select_action` computes it",
          no_op="nothing is replaced: the method is called as LeRobot calls it",
          upstream="a public method of `DiffusionModel` returning the global conditioning of a batch")
def diffusion_global_conditioning(model, batch: dict):
    return model._prepare_global_conditioning(batch)


@register("lerobot.pi0_preprocess_images", kind=READ, checked={"lerobot": "0.4.4"},
          symbols=("lerobot.policies.pi0.modeling_pi0.PI0Policy._preprocess_images",),
          saves="the image embedding's reference: each camera resized and normalized by LeRobot's own code, "
                "as `select_action` prepares it",
          no_op="nothing is replaced: the method is called as LeRobot calls it",
          upstream="a public method of `PI0Policy` returning the images it feeds the VLM")
def pi0_preprocess_images(policy, batch: dict):
    return policy._preprocess_images(batch)
