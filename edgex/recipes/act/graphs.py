"""ACT as one graph: raw observation -> unnormalized action chunk, one pass.

Inputs: `state` [1, S] (raw robot state) and one image per camera [1, 3, H, W] (RGB in [0, 1], as
LeRobot's cameras deliver them). The graph owns the normalization of both and the unnormalization
of the actions (statistics baked), so a robot feeds sensor values and gets joint targets. At
inference ACT's VAE latent is zero, so the VAE encoder is not part of the graph.

The transformer is written here from the policy's weights (post- or pre-norm layers, attention as
matmuls, the 2-D sine position table precomputed for the static feature map); the ResNet backbone is
a copy of torchvision's module as the policy holds it, its frozen BatchNorms folded into the convs.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from .._lerobot.graph_ops import Affine, attention, image_norm, mode_of


def sine_table_2d(height: int, width: int, channels: int) -> torch.Tensor:
    """[H*W, 1, channels]: ACT's 2-D sine embedding (y half then x half; positions (i+1)/n * 2 pi)."""
    half = channels // 2
    freq = 10000.0 ** (2 * (np.arange(half) // 2) / half)

    def axis(n):
        angle = (np.arange(1, n + 1) / (n + 1e-6) * 2 * math.pi)[:, None] / freq
        out = np.empty_like(angle)
        out[:, 0::2], out[:, 1::2] = np.sin(angle[:, 0::2]), np.cos(angle[:, 1::2])
        return out

    y, x = axis(height), axis(width)
    table = np.concatenate([np.repeat(y[:, None], width, 1), np.repeat(x[None], height, 0)], axis=-1)
    return torch.from_numpy(table.reshape(height * width, 1, channels)).float()


def fold_batchnorm(backbone: nn.Module) -> nn.Module:
    """A copy of the ResNet trunk with each frozen BatchNorm folded (in float64) into the conv before
    it (`convK` + `bnK`, a downsample's `0` + `1`). QAIRT folds them itself when it writes a `.dlc`,
    whose kernels then match none of the graph's weights (its weight check reported every conv kernel
    missing); folded here, the graph holds the kernels the device files store."""
    import copy

    trunk = copy.deepcopy(backbone)
    with torch.no_grad():
        for parent in trunk.modules():
            for name, bn in list(parent.named_children()):
                if type(bn).__name__ not in ("FrozenBatchNorm2d", "BatchNorm2d"):
                    continue
                conv = getattr(parent, "conv" + name[2:] if name.startswith("bn") else str(int(name) - 1))
                scale = bn.weight.double() * (bn.running_var.double() + bn.eps).rsqrt()
                bias = bn.bias.double() - bn.running_mean.double() * scale
                if conv.bias is not None:
                    bias = bias + conv.bias.double() * scale
                conv.weight.copy_((conv.weight.double() * scale[:, None, None, None]).float())
                conv.bias = nn.Parameter(bias.float())
                setattr(parent, name, nn.Identity())
    return trunk


class ActPolicyGraph(nn.Module):
    """(raw state, each camera's image at its own shape) -> unnormalized action chunk. Each camera has
    its own normalization and its own 2-D position table (its feature map's size)."""

    def __init__(self, policy, stats: dict, cameras: list[str]):
        super().__init__()
        config = policy.config
        model = policy.model
        self.model, self.pre_norm = model, config.pre_norm
        self.backbone = fold_batchnorm(model.backbone)
        self.state_norm = Affine(stats.get("observation.state", {}), mode_of(config, config.robot_state_feature),
                                 config.robot_state_feature.shape)
        self.image_norm = nn.ModuleList(image_norm(config, stats, cam) for cam in cameras)
        action = config.action_feature
        self.action_unnorm = Affine(stats.get("action", {}), mode_of(config, action), action.shape, inverse=True)
        tables = [model.encoder_1d_feature_pos_embed.weight.detach()[:, None]]
        with torch.no_grad():
            for cam in cameras:
                fmap = model.backbone(torch.zeros(1, *config.image_features[cam].shape))["feature_map"]
                tables.append(sine_table_2d(fmap.shape[2], fmap.shape[3], config.dim_model))
        self.register_buffer("pos", torch.cat(tables), persistent=False)
        self.register_buffer("latent", torch.zeros(1, config.latent_dim), persistent=False)
        self.chunk, self.dim = config.chunk_size, config.dim_model

    def _latent_token(self):
        """The projection of the zero latent: its bias exactly (0 x W is 0), given as that constant.
        Run as a linear layer on a constant zero, a QDQ graph calibrates that input's range to zero,
        and the int32 bias's scale (the input's scale x the weight's) becomes so small that the bias
        overflows int32: at the published size the HTP's actions then miss by a whole spread."""
        proj = self.model.encoder_latent_input_proj
        return proj(self.latent) if proj.bias is None else proj.bias[None]

    def _encoder_layer(self, layer, x):
        skip = x
        if self.pre_norm:
            x = layer.norm1(x)
        q = x + self.pos
        x = skip + attention(layer.self_attn, q, q, x)
        if self.pre_norm:
            skip, x = x, layer.norm2(x)
        else:
            x = skip = layer.norm1(x)
        x = skip + layer.linear2(torch.relu(layer.linear1(x)))
        return x if self.pre_norm else layer.norm2(x)

    def _decoder_layer(self, layer, x, memory, query_pos):
        skip = x
        if self.pre_norm:
            x = layer.norm1(x)
        q = x + query_pos
        x = skip + attention(layer.self_attn, q, q, x)
        if self.pre_norm:
            skip, x = x, layer.norm2(x)
        else:
            x = skip = layer.norm1(x)
        x = skip + attention(layer.multihead_attn, x + query_pos, memory + self.pos, memory)
        if self.pre_norm:
            skip, x = x, layer.norm3(x)
        else:
            x = skip = layer.norm2(x)
        x = skip + layer.linear2(torch.relu(layer.linear1(x)))
        return x if self.pre_norm else layer.norm3(x)

    def forward(self, state, *images):
        m = self.model
        tokens = [self._latent_token()[None], m.encoder_robot_state_input_proj(self.state_norm(state))[None]]
        for norm, image in zip(self.image_norm, images):
            fmap = m.encoder_img_feat_input_proj(self.backbone(norm(image))["feature_map"])  # [1, D, h, w]
            tokens.append(fmap.flatten(2).permute(2, 0, 1))  # [(h w), 1, D]
        x = torch.cat(tokens)
        for layer in m.encoder.layers:
            x = self._encoder_layer(layer, x)
        if self.pre_norm:
            x = m.encoder.norm(x)
        query_pos = m.decoder_pos_embed.weight[:, None]
        y = torch.zeros(self.chunk, 1, self.dim, dtype=state.dtype)
        for layer in m.decoder.layers:
            y = self._decoder_layer(layer, y, x, query_pos)
        y = m.decoder.norm(y).transpose(0, 1)
        return self.action_unnorm(m.action_head(y))
