"""SmolVLA graphs, written from the policy's weights (no LeRobot / transformers forward is called).

Conventions LeRobot 0.4.4 fixes and these graphs follow (docs/models.md):
- images: resize-with-pad (bilinear, pad left/top with 0) to the config's size, then x * 2 - 1;
  image tokens and language embeddings are scaled by sqrt(hidden);
- prefix attention: image + language tokens attend each other (padding masked), the state token
  attends everything; positions are the running count of valid prefix tokens;
- RoPE with wavelength 10 000 (not the text config's rope_theta), halves rotated; K cached after RoPE;
- the expert alternates self-attention layers (queries and keys at absolute positions after the
  prefix, causal among the chunk) and cross-attention layers (the expert's k/v projections applied
  to the cached prefix K/V, queries at positions 0..chunk-1);
- the timestep embedding is sin/cos of 2 pi t / period, periods geometric from min to max period.
Masked scores are replaced (not offset) by -1e4, which reproduces LeRobot's float32-min fill in
fp32 (fully masked padding rows become uniform either way) and stays finite in fp16.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .._lerobot.graph_ops import Affine, gelu_tanh, grouped_attention, image_norm, mode_of, siglip_layer

_ROPE_WAVELENGTH = 10_000.0


def _rms(norm, x):
    x32 = x.float()
    # normalized activations first, the weight second: the same product, but the HTP fp16 finalize of
    # onnxruntime-qnn 2.7.0 (QAIRT 2.51) fails (QNN_COMMON_ERROR_MEM_ALLOC) on the prefix, step and
    # loop with the weight as Mul's first input (docs/toolchains.md)
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)).to(x.dtype) * norm.weight


def _rope(x, positions):
    """x [1, S, H, D], positions [1, S] float -> rotated (first half / second half pairs)."""
    half = x.shape[-1] // 2
    inv = _ROPE_WAVELENGTH ** (-(2.0 / x.shape[-1]) * torch.arange(half, dtype=torch.float32))
    angle = (positions[..., None].float() * inv)[..., None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _mlp(mlp, x):
    return mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))


class SmolVLAVision(nn.Module):
    """Every camera's image [1, 3, H, W] in [0, 1], each at its own shape -> its image tokens
    [1, N, hidden] (scaled by sqrt(hidden)). One SigLIP tower serves every camera; each camera has its
    own normalization (statistics baked, where the config normalizes images) and resize-with-pad."""

    def __init__(self, policy, stats: dict, cameras: list[str]):
        super().__init__()
        config = policy.config
        vlm = policy.model.vlm_with_expert.get_vlm_model()
        self.vision, self.connector = vlm.vision_model, vlm.connector
        vc = self.vision.config
        width, height = config.resize_imgs_with_padding
        self.norms = nn.ModuleList(image_norm(config, stats, cam) for cam in cameras)
        self.resized, self.pads = [], []
        for cam in cameras:
            _, h, w = config.image_features[cam].shape
            ratio = max(w / width, h / height)
            resized = (int(h / ratio), int(w / ratio))
            self.resized.append(resized)
            self.pads.append((max(0, int(width - resized[1])), 0, max(0, int(height - resized[0])), 0))
        self.heads, self.scale_factor = vc.num_attention_heads, vlm.config.scale_factor
        per_side = vc.image_size // vc.patch_size
        nh, nw = height // vc.patch_size, width // vc.patch_size
        edges = np.arange(1, per_side) / per_side
        rows = np.searchsorted(edges, np.arange(nh) / nh * (1 - 1e-6), side="right")
        cols = np.searchsorted(edges, np.arange(nw) / nw * (1 - 1e-6), side="right")
        self.register_buffer("positions", torch.from_numpy((rows[:, None] * per_side + cols[None]).reshape(-1)), persistent=False)
        self.text_scale = math.sqrt(vlm.config.text_config.hidden_size)

    def _tokens(self, x):
        emb = self.vision.embeddings
        x = emb.patch_embedding(x).flatten(2).transpose(1, 2) + emb.position_embedding.weight[self.positions]
        for layer in self.vision.encoder.layers:
            x = siglip_layer(layer, x, self.heads)
        x = self.vision.post_layernorm(x)
        # pixel shuffle: [1, n*n, d] -> [1, (n/s)^2, d*s*s], as SmolVLM's connector orders it
        n, s, d = int(round(x.shape[1] ** 0.5)), self.scale_factor, x.shape[2]
        x = x.reshape(1, n, n // s, d * s).permute(0, 2, 1, 3).reshape(1, n // s, n // s, d * s * s)
        x = x.permute(0, 2, 1, 3).reshape(1, (n // s) ** 2, d * s * s)
        return self.connector.modality_projection.proj(x) * self.text_scale

    def forward(self, *images):
        out = []
        for image, norm, resized, pad in zip(images, self.norms, self.resized, self.pads):
            x = F.interpolate(norm(image), size=resized, mode="bilinear", align_corners=False)
            out.append(self._tokens(F.pad(x, pad, value=0.0) * 2.0 - 1.0))
        return tuple(out)


class SmolVLAPrefix(nn.Module):
    """(image tokens per camera, language tokens / mask, raw state) -> per-layer K/V and the prefix mask.

    The graph owns the state normalization (statistics baked) and its zero-padding to max_state_dim."""

    def __init__(self, policy, stats: dict):
        super().__init__()
        config = policy.config
        model = policy.model
        self.text = model.vlm_with_expert.get_vlm_model().text_model
        self.state_proj = model.state_proj
        self.state_norm = Affine(stats.get("observation.state", {}), mode_of(config, config.robot_state_feature),
                                 config.robot_state_feature.shape)
        tc = model.vlm_with_expert.config.text_config
        self.heads, self.kv_heads, self.scale = tc.num_attention_heads, tc.num_key_value_heads, math.sqrt(tc.hidden_size)
        self.state_pad = config.max_state_dim - config.robot_state_feature.shape[0]

    def forward(self, *inputs):
        *images, tokens, lang_mask, state = inputs
        lang = self.text.embed_tokens(tokens) * self.scale
        s = F.pad(self.state_norm(state), (0, self.state_pad))
        x = torch.cat([*images, lang, self.state_proj(s)[:, None]], 1)  # [1, P, D]
        n_img = sum(i.shape[1] for i in images)
        ones = torch.ones(1, n_img, dtype=lang_mask.dtype)
        valid = torch.cat([ones, lang_mask, torch.ones(1, 1, dtype=lang_mask.dtype)], 1)  # [1, P]
        positions = valid.cumsum(1) - 1
        is_state = torch.zeros_like(valid)
        is_state[:, -1] = 1.0
        # block ids: image + language 0, state 1; a token sees tokens of its block or an earlier one
        allowed = (is_state[:, None, :] <= is_state[:, :, None]) & (valid[:, None, :] > 0) & (valid[:, :, None] > 0)
        keys, values = [], []
        for layer in self.text.layers:
            a = layer.self_attn
            h = _rms(layer.input_layernorm, x)
            shape = (1, x.shape[1], -1, a.head_dim)
            q = _rope(a.q_proj(h).reshape(shape), positions)
            k = _rope(a.k_proj(h).reshape(shape), positions)
            v = a.v_proj(h).reshape(shape)
            keys.append(k)
            values.append(v)
            x = x + a.o_proj(grouped_attention(q, k, v, allowed, self.kv_heads))
            x = x + _mlp(layer.mlp, _rms(layer.post_attention_layernorm, x))
        return torch.stack(keys), torch.stack(values), valid


class SmolVLAStep(nn.Module):
    """(x_t [1, C, A], t [1], prefix K/V, prefix mask) -> velocity [1, C, A] (normalized space)."""

    def __init__(self, policy):
        super().__init__()
        config = policy.config
        model = policy.model
        vwe = model.vlm_with_expert
        self.model, self.expert = model, vwe.lm_expert
        tc = vwe.config.text_config
        self.heads, self.kv_heads = tc.num_attention_heads, tc.num_key_value_heads
        self.layers = vwe.num_vlm_layers
        self.every = vwe.self_attn_every_n_layers
        self.cross = "cross" in vwe.attention_mode
        self.multiple = vwe.num_vlm_layers // vwe.num_expert_layers
        self.chunk = config.chunk_size
        half = vwe.expert_hidden_size // 2
        fraction = np.linspace(0.0, 1.0, half)
        scaling = 2 * math.pi / (config.min_period * (config.max_period / config.min_period) ** fraction)
        # a plain list, not a buffer: an fp16 build would round 2 pi / 0.004 = 1571 to a whole number
        self.time_scaling = [float(v) for v in scaling]

    def time_embedding(self, t):
        angle = t[:, None].float() * torch.tensor(self.time_scaling)[None]  # float32 even in fp16 graphs
        return torch.cat([angle.sin(), angle.cos()], -1).to(t.dtype)

    def velocity(self, x_t, time_emb, keys, values, valid):
        m = self.model
        a = m.action_in_proj(x_t)
        h = m.action_time_mlp_out(F.silu(m.action_time_mlp_in(torch.cat([a, time_emb[:, None].repeat(1, a.shape[1], 1)], -1))))
        chunk = h.shape[1]
        local = torch.arange(chunk, dtype=valid.dtype)[None]
        absolute = valid.sum(1, keepdim=True) + local
        causal = torch.ones(chunk, chunk).tril().bool()[None]
        prefix_ok = (valid > 0)[:, None, :].repeat(1, chunk, 1)  # repeat, not expand: ExecuTorch refuses 0 strides
        for i in range(self.layers):
            if i > 0 and i % self.multiple != 0:
                continue
            layer = self.expert.layers[i // self.multiple]
            at = layer.self_attn
            e = _rms(layer.input_layernorm, h)
            shape = (1, chunk, -1, at.head_dim)
            if not self.cross or (self.every > 0 and i % self.every == 0):
                q = _rope(at.q_proj(e).reshape(shape), absolute)
                k = torch.cat([keys[i], _rope(at.k_proj(e).reshape(shape), absolute)], 1)
                v = torch.cat([values[i], at.v_proj(e).reshape(shape)], 1)
                allowed = torch.cat([prefix_ok, causal], 2)
            else:
                q = _rope(at.q_proj(e).reshape(shape), local)
                flat = (1, keys.shape[2], -1)
                k = at.k_proj(keys[i].reshape(flat)).reshape(1, keys.shape[2], -1, at.head_dim)
                v = at.v_proj(values[i].reshape(flat)).reshape(1, keys.shape[2], -1, at.head_dim)
                allowed = prefix_ok
            h = h + at.o_proj(grouped_attention(q, k, v, allowed, self.kv_heads))
            h = h + _mlp(layer.mlp, _rms(layer.post_attention_layernorm, h))
        return m.action_out_proj(_rms(self.expert.norm, h))

    def forward(self, x_t, t, keys, values, valid):
        return self.velocity(x_t, self.time_embedding(t), keys, values, valid)


class SmolVLALoop(nn.Module):
    """(noise [1, C, max_action_dim], prefix K/V, prefix mask) -> unnormalized actions [1, C, action_dim].

    Euler from t = 1 to 0 in `steps` steps (dt = -1/steps); the time embeddings of the fixed
    times are baked in float64 precision. The graph owns the action unnormalization."""

    def __init__(self, policy, stats: dict, steps: int):
        super().__init__()
        config = policy.config
        self.step = SmolVLAStep(policy)
        self.dt = -1.0 / steps
        times = torch.tensor([1.0 + s * self.dt for s in range(steps)], dtype=torch.float32).double()
        fraction = np.linspace(0.0, 1.0, len(self.step.time_scaling))
        scaling = torch.from_numpy(2 * math.pi / (config.min_period * (config.max_period / config.min_period) ** fraction))
        angle = times[:, None] * scaling[None]
        self.register_buffer("time_emb", torch.cat([angle.sin(), angle.cos()], -1).float(), persistent=False)
        self.action_dim = config.action_feature.shape[0]
        self.unnorm = Affine(stats.get("action", {}), mode_of(config, config.action_feature), config.action_feature.shape, inverse=True)

    def forward(self, noise, keys, values, valid):
        x = noise
        for s in range(self.time_emb.shape[0]):
            x = x + self.dt * self.step.velocity(x, self.time_emb[s:s + 1], keys, values, valid)
        return self.unnorm(x[:, :, : self.action_dim])
