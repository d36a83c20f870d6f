"""Diffusion Policy graphs: vision encoder, one denoise step, and the whole DDIM loop.

- `DiffusionVision`: every camera's image [1, 3, H, W] (RGB in [0, 1]) -> the cameras' features
  side by side [1, cams * D]; owns each camera's image normalization and the eval-time center crop.
- `DiffusionStep`: (x_t [1, horizon, A], timestep [1] float, global_cond [1, C]) -> the U-Net's
  prediction, in normalized action space (what a runner looping itself calls).
- `DiffusionLoop`: (state history [1, n_obs, S] raw, image features [1, n_obs, cams * D], initial
  noise [1, horizon, A]) -> unnormalized actions [1, n_action_steps, A]. Owns the state
  normalization and the action unnormalization; DDIM with eta 0, its coefficients and step embeddings baked for the
  chosen number of steps, so the graph is deterministic given the noise.

The U-Net, spatial softmax and timestep embedding are written here from the policy's weights; the
ResNet trunk is torchvision's module as the policy holds it. The DDIM schedule is computed here
(float64) from the config's beta schedule, not read from diffusers.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ...errors import EdgexError
from .._lerobot.graph_ops import Affine, image_norm, mode_of


def alphas_cumprod(config) -> np.ndarray:
    """Cumulative products of (1 - beta) for the config's beta schedule, in float64."""
    steps = config.num_train_timesteps
    if config.beta_schedule == "squaredcos_cap_v2":
        def bar(t):
            return math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2
        betas = np.array([min(1 - bar((i + 1) / steps) / bar(i / steps), 0.999) for i in range(steps)])
    elif config.beta_schedule == "linear":
        betas = np.linspace(config.beta_start, config.beta_end, steps)
    elif config.beta_schedule == "scaled_linear":
        betas = np.linspace(config.beta_start ** 0.5, config.beta_end ** 0.5, steps) ** 2
    else:
        raise EdgexError(f"beta_schedule {config.beta_schedule!r} is not supported by edgex's DDIM loop")
    # diffusers keeps betas in float32: the same rounding here keeps the loop at >100 dB.
    return np.cumprod(1.0 - betas.astype(np.float32).astype(np.float64))


def ddim_schedule(config, steps: int) -> list[tuple[int, float, float]]:
    """[(timestep, alpha_bar_t, alpha_bar_prev)] for DDIM's 'leading' spacing, eta 0."""
    ac = alphas_cumprod(config)
    ratio = config.num_train_timesteps // steps
    timesteps = (np.arange(steps) * ratio).round()[::-1].astype(int)
    return [(int(t), float(ac[t]), float(ac[t - ratio]) if t - ratio >= 0 else 1.0) for t in timesteps]


def mish(x):
    """Mish, x tanh(softplus(x)), without a logarithm: tanh(log(1 + e^x)) = (e^2x + 2e^x) / (e^2x +
    2e^x + 2), written with u = exp(-|x|) in (0, 1] so nothing overflows: (1 + 2u) / (1 + 2u + 2u^2)
    for x >= 0, (u^2 + 2u) / (u^2 + 2u + 2) below (the same function; both are 3/5 at 0, where the
    sign blend takes their mean). MNN 3.6.1's converter refuses ONNX `Mish` (`These Op Not Support:
    ONNX::Mish`); the HTP returns 0 for every `Log` of a w8a16 QDQ graph (softplus's
    log(1 + exp(-|x|)), inputs in [1, 2], the Log kept in float too: the U-Net scored 3.6 dB against
    its own QDQ graph), and its select (`Where`) refuses the U-Net's shapes, hence the blend."""
    u = torch.exp(-x.abs())
    up = (torch.sign(x) + 1.0) * 0.5
    two_u = 2.0 * u
    above = (1.0 + two_u) / (1.0 + two_u + two_u * u)
    below = (u * u + two_u) / (u * u + two_u + 2.0)
    return x * (up * above + (1.0 - up) * below)


class _Unet(nn.Module):
    """LeRobot's conditional 1-D U-Net, forward written from its layers."""

    def __init__(self, unet, config):
        super().__init__()
        self.unet, self.film = unet, config.use_film_scale_modulation
        half = config.diffusion_step_embed_dim // 2
        # [1, half], as the graph reads them: a buffer reshaped in the graph is an Unsqueeze of a constant,
        # which ONNX Runtime's QDQ quantizer refuses ("Quantization parameter shared mode is not
        # supported for weight yet"), as it does a Slice of one
        freqs = torch.exp(torch.arange(half, dtype=torch.float64) * -(math.log(10000) / (half - 1))).float()
        self.register_buffer("freqs", freqs[None].clone(), persistent=False)

    @staticmethod
    def _conv_block(block, x):
        conv, norm, _ = block.block
        return mish(norm(conv(x)))

    def _res(self, res, x, cond):
        out = self._conv_block(res.conv1, x)
        embed = res.cond_encoder[1](mish(cond))[..., None]
        if self.film:
            out = embed[:, : res.out_channels] * out + embed[:, res.out_channels:]
        else:
            out = out + embed
        out = self._conv_block(res.conv2, out)
        return out + res.residual_conv(x)

    def step_embedding(self, timestep):
        """The diffusion step encoder's output [1, E] for timestep [1] (float)."""
        angle = timestep[:, None] * self.freqs
        enc = self.unet.diffusion_step_encoder
        return enc[3](mish(enc[1](torch.cat([angle.sin(), angle.cos()], -1))))

    def forward(self, x, cond):
        """x [1, horizon, A] and the conditioning [1, E + G]: step embedding, then global condition."""
        u = self.unet
        x = x.transpose(1, 2)
        skips = []
        for res1, res2, down in u.down_modules:
            x = self._res(res2, self._res(res1, x, cond), cond)
            skips.append(x)
            x = down(x)
        for mid in u.mid_modules:
            x = self._res(mid, x, cond)
        for res1, res2, up in u.up_modules:
            x = torch.cat([x, skips.pop()], 1)
            x = up(self._res(res2, self._res(res1, x, cond), cond))
        x = u.final_conv[1](self._conv_block(u.final_conv[0], x))
        return x.transpose(1, 2)


class _CameraEncoder(nn.Module):
    """One camera through an RGB encoder: its own normalization, the eval-time center crop, ResNet,
    spatial softmax, linear + ReLU -> [1, D]."""

    def __init__(self, encoder, norm: nn.Module, shape: tuple[int, int, int], crop: tuple[int, int] | None):
        super().__init__()
        self.norm = norm
        h, w = crop if crop is not None else shape[1:]
        self.top, self.left = int(round((shape[1] - h) / 2.0)), int(round((shape[2] - w) / 2.0))
        self.size = (h, w)
        self.backbone, self.keypoints, self.out = encoder.backbone, encoder.pool.nets, encoder.out
        with torch.no_grad():
            fh, fw = self.backbone(torch.zeros(1, shape[0], h, w)).shape[2:]
        gx, gy = np.meshgrid(np.linspace(-1.0, 1.0, fw), np.linspace(-1.0, 1.0, fh))
        self.register_buffer("grid", torch.from_numpy(np.stack([gx.reshape(-1), gy.reshape(-1)], 1)).float(), persistent=False)

    def forward(self, image):
        x = self.norm(image)[:, :, self.top:self.top + self.size[0], self.left:self.left + self.size[1]]
        maps = self.keypoints(self.backbone(x))  # [1, K, h, w]
        attn = maps.flatten(2).softmax(-1)  # [1, K, h*w]
        points = attn @ self.grid  # [1, K, 2]
        return torch.relu(self.out(points.flatten(1)))


class DiffusionVision(nn.Module):
    """Every camera's image -> the cameras' features side by side [1, cams * D], in the policy's
    camera order (LeRobot's global conditioning order). Each camera is normalized with its own
    statistics; one RGB encoder serves every camera, or each its own
    (`use_separate_rgb_encoder_per_camera`)."""

    def __init__(self, policy, stats: dict, cameras: list[str]):
        super().__init__()
        config = policy.config
        if config.resize_shape is not None:
            raise EdgexError("diffusion-policy with resize_shape is not supported by edgex's vision graph (crop only)")
        encoders = policy.diffusion.rgb_encoder
        if not config.use_separate_rgb_encoder_per_camera:
            encoders = [encoders] * len(cameras)
        self.cameras = nn.ModuleList(
            _CameraEncoder(encoder, image_norm(config, stats, cam), tuple(config.image_features[cam].shape), config.crop_shape)
            for encoder, cam in zip(encoders, cameras))

    def forward(self, *images):
        return torch.cat([camera(image) for camera, image in zip(self.cameras, images)], -1)


class DiffusionStep(nn.Module):
    def __init__(self, policy):
        super().__init__()
        self.unet = _Unet(policy.diffusion.unet, policy.config)

    def forward(self, sample, timestep, global_cond):
        return self.unet(sample, torch.cat([self.unet.step_embedding(timestep), global_cond], -1))


class DiffusionLoop(nn.Module):
    def __init__(self, policy, stats: dict, steps: int):
        super().__init__()
        config = policy.config
        self.unet = _Unet(policy.diffusion.unet, config)
        self.state_norm = Affine(stats.get("observation.state", {}), mode_of(config, config.robot_state_feature),
                                 config.robot_state_feature.shape)
        self.action_unnorm = Affine(stats.get("action", {}), mode_of(config, config.action_feature),
                                    config.action_feature.shape, inverse=True)
        self.schedule = ddim_schedule(config, steps)
        # The step encoder's output for each fixed timestep, computed here once: left in the graph it
        # is a subgraph of constants only, which QNN's HTP refuses ("Having zero graph inputs is not
        # supported on this backend"). It is added, zero-padded, to the zero-padded global condition
        # (the same vector as their concatenation): a constant concatenated with an activation is a
        # tensor ONNX Runtime's QDQ quantizer cannot give shared parameters ("Quantization parameter
        # shared mode is not supported for weight yet"). A buffer, so fp16 builds store it rounded.
        width = policy.diffusion.unet.mid_modules[0].cond_encoder[1].in_features
        with torch.no_grad():
            embeddings = torch.cat([self.unet.step_embedding(torch.full((1,), float(t))) for t, _, _ in self.schedule])
        self.global_pad = (embeddings.shape[1], 0)
        for i, row in enumerate(F.pad(embeddings, (0, width - embeddings.shape[1]))):  # one [1, E + G] buffer per step
            self.register_buffer(f"step_cond_{i}", row[None].clone(), persistent=False)
        self.epsilon = config.prediction_type == "epsilon"
        self.clip = config.clip_sample_range if config.clip_sample else None
        self.start, self.count = config.n_obs_steps - 1, config.n_action_steps

    def forward(self, state, features, noise):
        cond = F.pad(torch.cat([self.state_norm(state), features], -1).flatten(1), self.global_pad)
        x = noise
        for i, (_, a, a_prev) in enumerate(self.schedule):
            out = self.unet(x, cond + getattr(self, f"step_cond_{i}"))
            if self.epsilon:
                x0, eps = (x - math.sqrt(1 - a) * out) / math.sqrt(a), out
            else:
                x0, eps = out, (x - math.sqrt(a) * out) / math.sqrt(1 - a)
            if self.clip is not None:
                x0 = x0.clamp(-self.clip, self.clip)
            x = math.sqrt(a_prev) * x0 + math.sqrt(1 - a_prev) * eps
        return self.action_unnorm(x[:, self.start:self.start + self.count])
