"""Code2Wav decoder graphs: a windowed offline decode and the exact streaming pair.

The decoder is causal: RVQ dequantize -> causal conv (k=3) -> 72-frame sliding-window transformer
-> upsampling conv stack -> wav (1920 samples per frame). Every conv has stride 1 with left
padding only, so only the transformer is long-range.

* `code2wav`: codes of `context + new` frames -> the wav of the new frames. Approximate (~65 dB on
  real weights): the window truncates attention history.
* `code2latent`: new frames -> latents, with the transformer's sliding-window KV as a rolling ring
  (window-1 slots, rolled inside the graph) and the pre-conv's 2 frames of state. Exact.
* `latent2wav`: `context + new` latent frames -> wav of the new frames. The context covers the conv
  stack's receptive field, so it is exact; at stream start `context_valid` < context marks the
  leading frames as absent and each conv sees zeros there, exactly like the offline zero padding.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from ...nn.transformer import attach_norm_constants, decoder_layer, mask_from_valid, rms_norm, register_rope, rope_cos_sin, rope_inv_freq

_SNAKE_EPS = 1e-9  # SnakeBeta's guard against 1 / 0


def _causal_conv(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A causal conv (Qwen3TTSTokenizerV2CausalConvNet's torch `conv`): left padding of the dilated
    kernel's reach minus the stride, from the conv's own geometry; no extra right padding (0 at stride 1)."""
    c = conv.conv
    left = (c.kernel_size[0] - 1) * c.dilation[0] + 1 - c.stride[0]
    return c(nn.functional.pad(x, (left, 0)))


def _trans_conv(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A causal transposed conv: the kernel - stride trailing samples are cut."""
    c = conv.conv
    y = c(x)
    cut = c.kernel_size[0] - c.stride[0]
    return y[..., : y.shape[-1] - cut] if cut > 0 else y


def _snake(act: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """SnakeBeta on [B, C, T] from its log-scale `alpha` / `beta` parameters:
    x + sin(x e^alpha)^2 / (e^beta + eps)."""
    alpha = torch.exp(act.alpha)[None, :, None]
    beta = torch.exp(act.beta)[None, :, None]
    return x + torch.sin(x * alpha) ** 2 / (beta + _SNAKE_EPS)


def _codebooks(quantizer: nn.Module) -> list[list[torch.Tensor]]:
    """The split residual VQ's codebooks per group, each entry its running sum over its usage,
    folded here once: the graph stores and gathers from exactly these tables in every format (left
    to the exporters, ONNX kept `embedding_sum` and the clamped `cluster_usage` and divided per
    call, while converters that fold constants store the quotient), so a table's rows can be read
    back from any file (`Component.tables`)."""
    return [[(vq._codebook.embedding_sum / torch.clamp(vq._codebook.cluster_usage, min=vq._codebook.epsilon)[:, None]).detach().clone()
             for vq in group.vq.layers] for group in (quantizer.rvq_first, quantizer.rvq_rest)]


def _dequantize(quantizer: nn.Module, tables: list[list[torch.Tensor]], codes: torch.Tensor) -> torch.Tensor:
    """codes [B, K, T] -> [B, D, T]: each code's codebook entry (`tables`, `_codebooks`), summed per
    group and projected; the first `n_q_semantic` codes are the first group, the rest the second."""
    first = quantizer.n_q_semantic
    total = None
    groups = ((quantizer.rvq_first, codes[:, :first]), (quantizer.rvq_rest, codes[:, first:]))
    for (group, group_codes), group_tables in zip(groups, tables):
        summed = None
        for k, (vq, table) in enumerate(zip(group.vq.layers, group_tables)):
            entry = vq.project_out(nn.functional.embedding(group_codes[:, k], table))  # [B, T, D]
            summed = entry if summed is None else summed + entry
        projected = group.output_proj(summed.transpose(1, 2))
        total = projected if total is None else total + projected
    return total


def _zero_before(x: torch.Tensor, first: torch.Tensor | None) -> torch.Tensor:
    """Zero time steps < first (a 0-d/1-element tensor of samples at x's rate)."""
    if first is None:
        return x
    keep = torch.arange(x.shape[-1]) >= first
    return x * keep.to(x.dtype)


def receptive_field_frames(decoder: nn.Module) -> int:
    """Latent frames of left context the conv stack needs for an exact result, from the config.

    Walks the stack output-to-input: a causal conv looks back (k-1)*d samples at its input rate, a
    transposed conv (kernel k, stride s) at most ceil((k-1)/s) input samples."""
    rate, history = 1.0, 0.0

    def conv(module):
        nonlocal history
        history += (module.conv.kernel_size[0] - 1) * module.conv.dilation[0] / rate

    def trans(module):
        nonlocal history, rate
        kernel, stride = module.conv.kernel_size[0], module.conv.stride[0]
        history += math.ceil((kernel - 1) / stride) / rate
        rate *= stride

    for up, convnext in decoder.upsample:
        trans(up)
        conv(convnext.dwconv)
    conv(decoder.decoder[0])
    for block in decoder.decoder[1:-2]:
        trans(block.block[1])
        for unit in block.block[2:]:
            conv(unit.conv1)
            conv(unit.conv2)
    conv(decoder.decoder[-1])
    return math.ceil(history)


class _DecoderGraph(nn.Module):
    def __init__(self, decoder: nn.Module, positions: int | None):
        """`positions`: the bound of the frame positions the transformer takes (None: unbounded)."""
        super().__init__()
        self.decoder = decoder
        attach_norm_constants(decoder)
        self.transformer = decoder.pre_transformer
        self.window = int(decoder.config.sliding_window)
        self.upsample_per_frame = int(decoder.total_upsample)
        register_rope(self, "rope", rope_inv_freq(decoder.config), positions)

    def _hold_codebooks(self):
        """For the graphs that take codes: buffers codebook_<group>_<k> (`_codebooks`)."""
        self._books = []
        for g, group in enumerate(_codebooks(self.decoder.quantizer)):
            for k, table in enumerate(group):
                self.register_buffer(f"codebook_{g}_{k}", table, persistent=False)
            self._books.append([f"codebook_{g}_{k}" for k in range(len(group))])

    def _quantized(self, codes):
        return _dequantize(self.decoder.quantizer, [[getattr(self, n) for n in group] for group in self._books], codes)

    def _transformer(self, latent, positions, past, mask):
        tr = self.transformer
        hidden = tr.input_proj(latent)
        cos, sin = rope_cos_sin(self, "rope", positions, hidden.dtype)
        new = []
        for i, layer in enumerate(tr.layers):
            pk, pv = (None, None) if past is None else (past[0][i], past[1][i])
            hidden, k, v = decoder_layer(layer, hidden, cos, sin, pk, pv, mask)
            new.append((k, v))
        return tr.output_proj(rms_norm(tr.norm, hidden)), new

    def _conv_stack(self, latent, first_frame):
        """latent [1, C, T] -> wav [1, 1, T * 1920]; frames < first_frame are treated as absent."""
        rate = 1
        first = lambda: None if first_frame is None else first_frame * rate  # noqa: E731
        hidden = latent
        for up, convnext in self.decoder.upsample:
            hidden = _trans_conv(up, _zero_before(hidden, first()))
            rate *= up.conv.stride[0]
            residual = hidden
            hidden = _causal_conv(convnext.dwconv, _zero_before(hidden, first()))
            hidden = convnext.pwconv2(convnext.act(convnext.pwconv1(convnext.norm(hidden.permute(0, 2, 1)))))
            hidden = residual + (convnext.gamma * hidden).permute(0, 2, 1)
        stages = self.decoder.decoder
        hidden = _causal_conv(stages[0], _zero_before(hidden, first()))
        for block in stages[1:-2]:
            snake, up, *units = block.block
            hidden = _trans_conv(up, _zero_before(_snake(snake, hidden), first()))
            rate *= up.conv.stride[0]
            for unit in units:
                inner = _causal_conv(unit.conv1, _zero_before(_snake(unit.act1, hidden), first()))
                hidden = hidden + _causal_conv(unit.conv2, _snake(unit.act2, inner))
        wav = _causal_conv(stages[-1], _zero_before(_snake(stages[-2], hidden), first()))
        return wav.clamp(min=-1, max=1)


class Code2WavWindow(_DecoderGraph):
    """codes [1, 16, context + new] -> wav [1, 1, new * 1920] of the last `new` frames; `frames` is
    context + new, the positions its transformer takes."""

    def __init__(self, decoder: nn.Module, new_frames: int, frames: int):
        super().__init__(decoder, frames)
        self._hold_codebooks()
        self.new_frames = new_frames

    def forward(self, codes):
        frames = codes.shape[-1]
        quantized = self._quantized(codes)
        latent = _causal_conv(self.decoder.pre_conv, quantized).transpose(1, 2)
        pos = torch.arange(frames)
        valid = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < self.window)
        hidden, _ = self._transformer(latent, pos, None, mask_from_valid(valid, latent.dtype)[None, None])
        wav = self._conv_stack(hidden.permute(0, 2, 1), None)
        return (wav[..., (frames - self.new_frames) * self.upsample_per_frame :],)


class Code2Latent(_DecoderGraph):
    """codes [1, 16, C], start [1] (absolute frame index of the chunk), conv_state [1, Dq, 2],
    past_key/past_value [L, 1, H, window-1, D] -> latent [1, latent_dim, C], conv_state, key, value
    (the rolled caches to feed back). Slots holding frames before 0 are masked by position.

    Its positions are absolute frame indices over the whole stream, with no bound the graph
    declares: its RoPE angles are computed in the graph (`register_rope` with no table)."""

    def __init__(self, decoder: nn.Module):
        super().__init__(decoder, None)
        self._hold_codebooks()

    def forward(self, codes, start, conv_state, past_key, past_value):
        chunk = codes.shape[-1]
        quantized = self._quantized(codes)
        stacked = torch.cat((conv_state, quantized), dim=-1)
        latent = self.decoder.pre_conv.conv(stacked).transpose(1, 2)
        slots = past_key.shape[3]
        q_pos = start + torch.arange(chunk)
        k_pos = torch.cat((start - slots + torch.arange(slots), q_pos))
        valid = (k_pos[None, :] >= 0) & (k_pos[None, :] <= q_pos[:, None]) & (q_pos[:, None] - k_pos[None, :] < self.window)
        mask = mask_from_valid(valid, latent.dtype)[None, None]
        hidden, new = self._transformer(latent, q_pos, (past_key, past_value), mask)
        keys = torch.stack([torch.cat((past_key[i], k), dim=2)[:, :, chunk:] for i, (k, _) in enumerate(new)])
        values = torch.stack([torch.cat((past_value[i], v), dim=2)[:, :, chunk:] for i, (_, v) in enumerate(new)])
        state_len = conv_state.shape[-1]
        return hidden.permute(0, 2, 1), stacked[..., stacked.shape[-1] - state_len :], keys, values


class Latent2Wav(_DecoderGraph):
    """latent [1, latent_dim, context + C], context_valid [1] -> wav [1, 1, C * 1920]."""

    def __init__(self, decoder: nn.Module, context: int):
        super().__init__(decoder, None)  # no transformer: its RoPE is never read
        self.context = context

    def forward(self, latent, context_valid):
        wav = self._conv_stack(latent, self.context - context_valid)
        return (wav[..., self.context * self.upsample_per_frame :],)


@torch.no_grad()
def window_reference(decoder, codes, new_frames: int):
    """Unmodified HF decoder on the window, keeping the new frames' samples."""
    wav = decoder(codes)
    return (wav[..., (codes.shape[-1] - new_frames) * int(decoder.total_upsample) :],)


@torch.no_grad()
def offline_latent(decoder, codes):
    """The unmodified decoder's latent (transformer output) over a whole utterance."""
    hidden = decoder.pre_conv(decoder.quantizer.decode(codes)).transpose(1, 2)
    return decoder.pre_transformer(inputs_embeds=hidden).last_hidden_state.permute(0, 2, 1)


@torch.no_grad()
def offline_wav_from_latent(decoder, latent):
    """The unmodified decoder's conv stack (upsample + decoder blocks) over a whole utterance."""
    hidden = latent
    for blocks in decoder.upsample:
        for block in blocks:
            hidden = block(hidden)
    for block in decoder.decoder:
        hidden = block(hidden)
    return hidden.clamp(min=-1, max=1)


@torch.no_grad()
def code2latent_reference(decoder, codes, start, conv_state, past_key, past_value):
    """Unmodified HF modules: pre_conv over [state, chunk]; pre_transformer with HF's own sliding
    window cache (DynamicSlidingWindowLayer keeps exactly window-1 positions) primed with the
    valid past entries."""
    s, chunk = int(start.reshape(-1)[0]), codes.shape[-1]
    quantized = decoder.quantizer.decode(codes)
    stacked = torch.cat((conv_state, quantized), dim=-1)
    hidden = decoder.pre_conv(stacked)[..., conv_state.shape[-1] :].transpose(1, 2)
    slots = past_key.shape[3]
    cache = DynamicCache(config=decoder.config)
    valid = min(s, slots)
    for i, layer in enumerate(cache.layers):
        layer.lazy_initialization(past_key[i])
        layer.keys = past_key[i][:, :, slots - valid :].clone()
        layer.values = past_value[i][:, :, slots - valid :].clone()
        layer.cumulative_length = s
    out = decoder.pre_transformer(
        inputs_embeds=hidden, past_key_values=cache, use_cache=True, cache_position=torch.arange(s, s + chunk)
    )
    keys, values = [], []
    for i, layer in enumerate(cache.layers):
        full_k = torch.cat((past_key[i], layer.keys[:, :, -chunk:]), dim=2)[:, :, chunk:]
        full_v = torch.cat((past_value[i], layer.values[:, :, -chunk:]), dim=2)[:, :, chunk:]
        keys.append(full_k)
        values.append(full_v)
    return (
        out.last_hidden_state.permute(0, 2, 1),
        stacked[..., -conv_state.shape[-1] :],
        torch.stack(keys),
        torch.stack(values),
    )


@torch.no_grad()
def latent2wav_reference(decoder, context: int, latent, context_valid):
    """Unmodified conv stack over only the valid frames (offline zero padding at stream start)."""
    valid = int(context_valid.reshape(-1)[0])
    wav = offline_wav_from_latent(decoder, latent[..., context - valid :])
    new = latent.shape[-1] - context
    return (wav[..., wav.shape[-1] - new * int(decoder.total_upsample) :],)
