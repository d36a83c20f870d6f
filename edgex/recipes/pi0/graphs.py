"""pi0 graphs, written from the policy's weights (no LeRobot or transformers forward is called).

Conventions LeRobot 0.4.4's pi0 fixes and these graphs follow (docs/models.md):
- images: resize-with-pad to the config's square resolution when the camera differs (bilinear, the
  padding centred, value -1 *before* the [0, 1] -> [-1, 1] map, so padded pixels reach SigLIP as -3;
  openpi pads after it, with -1), then x * 2 - 1; SigLIP without its head, then the linear projector,
  unscaled;
- language embeddings are scaled by sqrt(width); nothing else is (the fork drops Gemma's own scaling);
- Gemma: RMSNorm with (1 + weight), tanh-GELU gated MLP, RoPE theta 10 000 on halves, K cached after
  RoPE; prefix tokens attend every valid prefix token; positions are the running count of valid tokens;
- the suffix is [state token, chunk action tokens]: the state token sees the prefix and itself, the
  action tokens see the prefix, the state and every action token (not causal); its positions follow
  the prefix's valid count;
- the time embedding is [sin, cos] of 2 pi t / period, periods geometric from min to max period,
  concatenated to action_in_proj(x_t) and fused by a SiLU MLP.
Masked scores are replaced (not offset) by -1e4: LeRobot adds -2.38e38, which makes a fully masked
row (a padding query) uniform over every key, as the replacement does, and stays finite in fp16.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from .._lerobot.graph_ops import Affine, gelu_tanh, grouped_attention, image_norm, mode_of, siglip_layer

_ROPE_THETA = 10_000.0


def _rms(norm, x):
    """Gemma RMSNorm: float32 statistics, scale (1 + weight)."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
    return (normed * (1.0 + norm.weight.float())).to(x.dtype)


def _rope(x, positions):
    """x [1, S, H, D], positions [1, S] float -> rotated (first half / second half pairs)."""
    half = x.shape[-1] // 2
    inv = 1.0 / _ROPE_THETA ** (torch.arange(0, x.shape[-1], 2, dtype=torch.int64).float() / x.shape[-1])
    angle = (positions[..., None].float() * inv)[..., None, :]
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def _mlp(mlp, x):
    return mlp.down_proj(gelu_tanh(mlp.gate_proj(x)) * mlp.up_proj(x))


def _layer(layer, h, positions, past_k, past_v, allowed, kv_heads):
    """One Gemma decoder layer over h [1, S, W]; past K/V [1, T, KV, D] or None -> (h, k, v)."""
    at = layer.self_attn
    e = _rms(layer.input_layernorm, h)
    shape = (1, h.shape[1], -1, at.head_dim)
    q = _rope(at.q_proj(e).reshape(shape), positions)
    k = _rope(at.k_proj(e).reshape(shape), positions)
    v = at.v_proj(e).reshape(shape)
    keys = k if past_k is None else torch.cat([past_k, k], 1)
    values = v if past_v is None else torch.cat([past_v, v], 1)
    h = h + at.o_proj(grouped_attention(q, keys, values, allowed, kv_heads))
    return h + _mlp(layer.mlp, _rms(layer.post_attention_layernorm, h)), k, v


class PI0Vision(nn.Module):
    """Every camera's image [1, 3, H, W] in [0, 1], each at its own shape -> its image tokens
    [1, N, width] (unscaled projector output). One SigLIP tower serves every camera; each camera has
    its own normalization (statistics baked, where the config normalizes images) and resize-with-pad."""

    def __init__(self, policy, stats: dict, cameras: list[str]):
        super().__init__()
        config = policy.config
        pali = policy.model.paligemma_with_expert.paligemma.model
        self.vision, self.projector = pali.vision_tower.vision_model, pali.multi_modal_projector
        self.heads = self.vision.config.num_attention_heads
        self.norms = nn.ModuleList(image_norm(config, stats, cam) for cam in cameras)
        height, width = config.image_resolution
        self.resized, self.pads = [], []
        for cam in cameras:
            _, h, w = config.image_features[cam].shape
            resized = pad = None
            if (h, w) != (height, width):
                ratio = max(w / width, h / height)
                resized = (int(h / ratio), int(w / ratio))
                top, left = (height - resized[0]) // 2, (width - resized[1]) // 2
                pad = (left, width - resized[1] - left, top, height - resized[0] - top)
            self.resized.append(resized)
            self.pads.append(pad)

    def _tokens(self, x):
        emb = self.vision.embeddings
        x = emb.patch_embedding(x * 2.0 - 1.0).flatten(2).transpose(1, 2) + emb.position_embedding.weight[None]
        for layer in self.vision.encoder.layers:
            x = siglip_layer(layer, x, self.heads)
        return self.projector.linear(self.vision.post_layernorm(x))

    def forward(self, *images):
        out = []
        for image, norm, resized, pad in zip(images, self.norms, self.resized, self.pads):
            x = norm(image)
            if resized is not None:
                # LeRobot clamps the resized image to [-1, 1]: a no-op on [0, 1] images (bilinear weights
                # are a convex combination), kept only where the camera is normalized first. Its pad value
                # -1 as a zero pad of x + 1: ExecuTorch's fp16 XNNPACK lowering of a constant -1 pad scored 5.7 dB
                x = F.interpolate(x, size=resized, mode="bilinear", align_corners=False)
                if not isinstance(norm, nn.Identity):
                    x = x.clamp(-1.0, 1.0)
                x = F.pad(x + 1.0, pad, value=0.0) - 1.0
            out.append(self._tokens(x))
        return tuple(out)


class PI0Prefix(nn.Module):
    """(image tokens per camera, language tokens / mask) -> per-layer K/V [L, 1, P, KV, D] and the mask [1, P]."""

    def __init__(self, policy):
        super().__init__()
        self.text = policy.model.paligemma_with_expert.paligemma.model.language_model
        self.kv_heads = self.text.config.num_key_value_heads
        self.scale = math.sqrt(self.text.config.hidden_size)

    def forward(self, *inputs):
        *images, tokens, lang_mask = inputs
        x = torch.cat([*images, self.text.embed_tokens(tokens) * self.scale], 1)  # [1, P, W]
        n_img = sum(i.shape[1] for i in images)
        valid = torch.cat([torch.ones(1, n_img, dtype=lang_mask.dtype), lang_mask], 1)  # [1, P]
        positions = valid.cumsum(1) - 1
        allowed = (valid[:, None, :] > 0) & (valid[:, :, None] > 0)
        keys, values = [], []
        for layer in self.text.layers:
            x, k, v = _layer(layer, x, positions, None, None, allowed, self.kv_heads)
            keys.append(k)
            values.append(v)
        return torch.stack(keys), torch.stack(values), valid


def time_scaling(config, width: int) -> np.ndarray:
    """2 pi / period for the width / 2 sine-cosine pairs, in float64."""
    fraction = np.linspace(0.0, 1.0, width // 2)
    return 2 * math.pi / (config.min_period * (config.max_period / config.min_period) ** fraction)


class PI0Step(nn.Module):
    """(x_t [1, C, A], t [1], raw state [1, S], prefix K/V, prefix mask) -> velocity [1, C, A] (normalized space).

    The graph owns the state normalization (statistics baked) and its zero-padding to max_state_dim."""

    def __init__(self, policy, stats: dict):
        super().__init__()
        config = policy.config
        self.model = policy.model
        self.expert = self.model.paligemma_with_expert.gemma_expert.model
        self.kv_heads = self.expert.config.num_key_value_heads
        self.state_norm = Affine(stats.get("observation.state", {}), mode_of(config, config.robot_state_feature),
                                 config.robot_state_feature.shape)
        self.state_pad = config.max_state_dim - config.robot_state_feature.shape[0]
        # frequencies t / period split so the angle's whole turns drop out exactly (see time_embedding);
        # plain lists, not buffers: an fp16 build would round them
        freq = time_scaling(config, self.expert.config.hidden_size) / (2 * math.pi)
        mantissa, exponent = np.frexp(freq)
        high = np.ldexp(np.round(mantissa * 2.0**11), exponent - 11)  # 11 significant bits
        self.freq_high, self.freq_low, self.freq = ([float(v) for v in a] for a in (high, freq - high, freq))

    def time_embedding(self, t):
        """[sin, cos](2 pi t / period) in float32 (even in fp16 graphs) to ~1e-7 rad, as the float64
        reference: t / period reaches 250 turns, where a float32 angle is off by 1e-4 rad (90 dB on the
        velocity). t splits into a multiple of 2^-12 and a rest, the frequency into 11 significant
        bits and a rest; the product of the two high parts is exact in float32, so its whole turns
        are removed exactly and only small terms carry rounding."""
        t32 = t[:, None].float()
        t_high = torch.round(t32 * 4096.0) / 4096.0
        high = t_high * torch.tensor(self.freq_high)[None]
        turns = (high - torch.round(high)) + (t_high * torch.tensor(self.freq_low)[None] + (t32 - t_high) * torch.tensor(self.freq)[None])
        angle = turns * (2 * math.pi)
        return torch.cat([angle.sin(), angle.cos()], -1).to(t.dtype)

    def velocity(self, x_t, time_emb, state_token, keys, values, valid):
        m = self.model
        a = m.action_in_proj(x_t)
        fused = torch.cat([a, time_emb[:, None].repeat(1, a.shape[1], 1)], -1)
        h = torch.cat([state_token, m.action_time_mlp_out(F.silu(m.action_time_mlp_in(fused)))], 1)  # [1, 1 + C, W]
        n = h.shape[1]
        positions = valid.sum(1, keepdim=True) + torch.arange(n, dtype=valid.dtype)[None]
        block = torch.ones(n)
        block[0] = 0.0  # state token 0, action tokens 1: a token sees its block and earlier ones
        suffix_ok = (block[None, :] <= block[:, None])[None]
        prefix_ok = (valid > 0)[:, None, :].repeat(1, n, 1)  # repeat, not expand: ExecuTorch refuses 0 strides
        allowed = torch.cat([prefix_ok, suffix_ok], 2)
        for i, layer in enumerate(self.expert.layers):
            h, _, _ = _layer(layer, h, positions, keys[i], values[i], allowed, self.kv_heads)
        return m.action_out_proj(_rms(self.expert.norm, h)[:, 1:])

    def state_token(self, state):
        return self.model.state_proj(F.pad(self.state_norm(state), (0, self.state_pad)))[:, None]

    def forward(self, x_t, t, state, keys, values, valid):
        return self.velocity(x_t, self.time_embedding(t), self.state_token(state), keys, values, valid)


class PI0Loop(nn.Module):
    """(noise [1, C, max_action_dim], raw state, prefix K/V, prefix mask) -> unnormalized actions [1, C, action_dim].

    Euler from t = 1 to 0 in `steps` steps (dt = -1/steps); the time embeddings of the fixed
    times are baked in float64 precision. The graph owns the state normalization and the action
    unnormalization."""

    def __init__(self, policy, stats: dict, steps: int):
        super().__init__()
        config = policy.config
        self.step = PI0Step(policy, stats)
        self.dt = -1.0 / steps
        times = torch.tensor([1.0 + s * self.dt for s in range(steps)], dtype=torch.float32).double()
        angle = times[:, None] * torch.from_numpy(time_scaling(config, self.step.expert.config.hidden_size))[None]
        self.register_buffer("time_emb", torch.cat([angle.sin(), angle.cos()], -1).float(), persistent=False)
        self.action_dim = config.action_feature.shape[0]
        self.unnorm = Affine(stats.get("action", {}), mode_of(config, config.action_feature), config.action_feature.shape, inverse=True)

    def forward(self, noise, state, keys, values, valid):
        x = noise
        token = self.step.state_token(state)
        for s in range(self.time_emb.shape[0]):
            x = x + self.dt * self.step.velocity(x, self.time_emb[s:s + 1], token, keys, values, valid)
        return self.unnorm(x[:, :, : self.action_dim])
