"""Token2wav's streaming token encoder as one graph (`FlowEncoder`): 25 + 3 lookahead tokens -> mu.

Written from the official `UpsampleConformerEncoderV2.forward_chunk` + `encoder_proj` (stepaudio2
1.0.5, the path `CausalMaskedDiffWithXvec.inference_chunk` runs per streaming chunk) over the
official modules' parameters, never their forwards:
  * token embedding; `embed`: linear, LayerNorm (1e-5), x sqrt(d); the last chunk zeroes the 3
    lookahead rows after it (the official call pads zeros there);
  * pre-lookahead: k=4 conv over the 28 rows (-> 25), leaky ReLU 0.01, then a k=3 conv over the 2
    cached rows + those 25, plus the 25 inputs (residual);
  * conformer blocks (pre-norm, LayerNorm 1e-12, no conv module, no macaron): relative-position
    self-attention (Transformer-XL: (q + u) k^T + (q + v) p_(i-j)^T, over sqrt(d_k)) from the 25
    new rows to the cached rows and themselves, unmasked as in the official streaming call, then a
    SiLU feed-forward;
  * upsampling: nearest x2, 4 cached rows in front, k=5 conv (-> 50 frames); `up_embed` as
    `embed`; the second conformer stack over the 50 frames; final LayerNorm (1e-5); `encoder_proj`.
The relative positions are those of the official espnet encoding: sin / cos of r w_k (interleaved)
for the distance r of query and key, which the official code reaches with its pad-and-reshape
shift; here the distance of every (query, key) pair is a constant index into a table of all
distances the call can see.

Caches are explicit and static: `att_cache1` [L1, 1, H, S, 2 d_k] (25 Hz, key | value) and
`att_cache2` [L2, 1, H, 2 S, 2 d_k] (50 Hz) hold the valid entries right-aligned, the last
`cache_len` (25 Hz) / 2 `cache_len` (50 Hz) slots; the rest is masked out. `cnn_cache` [1, C, 6]
holds the pre-lookahead's 2 rows and the upsampler's 4. The graph returns only the new entries
(25 / 50 key | value rows per layer) and the new conv cache; the runner appends them, as
Token2wav's `stream` appends (and trims) the official caches.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ...errors import EdgexError
from .flow import _layer_norm, _silu

LOOKAHEAD = 3
CHUNK = 25  # new tokens per streaming call (1 s at 25 Hz)


def _distance_table(max_r: int, min_r: int, d_model: int) -> torch.Tensor:
    """[sin(r w), cos(r w)] interleaved for r = min_r .. max_r, in float32 like the official table."""
    r = torch.arange(min_r, max_r + 1, dtype=torch.float32)[:, None]
    w = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
    table = torch.zeros(r.shape[0], d_model)
    table[:, 0::2] = torch.sin(r * w)
    table[:, 1::2] = torch.cos(r * w)
    return table


class _RelAttentionStack(nn.Module):
    """Conformer blocks over `new` rows after `slots` cached rows (right-aligned, `valid` of them real)."""

    def __init__(self, layers: nn.ModuleList, new: int, slots: int):
        super().__init__()
        self.layers = layers
        attn = layers[0].self_attn
        self.heads, self.d_k = attn.h, attn.d_k
        self.new, self.slots = new, slots
        # query i sits at key position slots + i; distance r = slots + i - j, from -(new-1) to slots + new - 1
        self.min_r = -(new - 1)
        i, j = torch.arange(new)[:, None], torch.arange(slots + new)[None]
        self.register_buffer("index", (slots + i - j - self.min_r).expand(self.heads, new, slots + new).contiguous(),
                             persistent=False)
        # Each layer's projected distance table, p^T [H, dk, R]: `linear_pos` of a constant is a
        # constant, which converters fold into an unnamed tensor (Core ML then compresses it at
        # w8 / w4 as a weight no module tensor names, and its stored bytes could not be checked).
        # Computed once here in float32, as the graph computed it, and stored under its own name.
        table = _distance_table(slots + new - 1, self.min_r, self.heads * self.d_k)
        with torch.no_grad():
            for n, layer in enumerate(layers):
                p = layer.self_attn.linear_pos(table).reshape(-1, self.heads, self.d_k).permute(1, 2, 0)
                self.register_buffer(f"distance_keys_{n}", p.contiguous(), persistent=False)

    def _attention(self, attn, distance_keys, x, cache, keep):
        b, t, _ = x.shape
        h, dk = self.heads, self.d_k

        def heads(lin):
            return lin(x).reshape(b, t, h, dk).transpose(1, 2)  # [1, H, T, dk]

        q, k_new, v_new = heads(attn.linear_q), heads(attn.linear_k), heads(attn.linear_v)
        k = torch.cat((cache[..., :dk], k_new), dim=2)
        v = torch.cat((cache[..., dk:], v_new), dim=2)
        ac = torch.matmul(q + attn.pos_bias_u[None, :, None], k.transpose(2, 3))
        bd_all = torch.matmul(q + attn.pos_bias_v[None, :, None], distance_keys)  # [1, H, T, R]
        bd = torch.gather(bd_all, 3, self.index[None])
        scores = (ac + bd) / math.sqrt(dk)
        scores = scores.masked_fill(~keep, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, t, h * dk)
        return attn.linear_out(out), torch.cat((k_new, v_new), dim=-1)

    def forward(self, x, caches, valid, new_valid=None):
        """x [1, new, C], caches [L, 1, H, slots, 2 dk], valid [1] (real cached rows), `new_valid`
        [1] (real new rows, the first ones; all when None) -> x, new cache rows [L, 1, H, new, 2 dk].
        Rows past `new_valid` are no keys: the real rows see what a call of that many rows sees."""
        slot = torch.arange(self.slots + self.new)
        keep = slot >= (self.slots - valid)  # [slots + new]
        if new_valid is not None:
            keep = keep & (slot < self.slots + new_valid)
        written = []
        for n, (layer, cache) in enumerate(zip(self.layers, caches)):
            norm = layer.norm_mha
            distance_keys = getattr(self, f"distance_keys_{n}")
            out, entry = self._attention(layer.self_attn, distance_keys, _layer_norm(x, norm, norm.eps), cache, keep)
            x = x + out
            written.append(entry)
            norm, ff = layer.norm_ff, layer.feed_forward
            x = x + ff.w_2(_silu(ff.w_1(_layer_norm(x, norm, norm.eps))))
        return x, torch.stack(written)


class FlowEncoder(nn.Module):
    """tokens [1, 28] (25 new + 3 lookahead), att_cache1 [L1,1,H,S,2dk], att_cache2 [L2,1,H,2S,2dk],
    cnn_cache [1, C, 6], cache_len [1] (valid 25 Hz rows), last_chunk [1] (1: the lookahead rows are
    padding) -> mu [1, 80, 50], new att rows [L1,1,H,25,2dk] / [L2,1,H,50,2dk], new cnn_cache."""

    def __init__(self, flow: nn.Module, slots: int):
        super().__init__()
        enc = flow.encoder
        self.embedding = flow.input_embedding
        self.embed, self.up_embed = enc.embed.out, enc.up_embed.out  # (Linear, LayerNorm, Dropout)
        self.scale = math.sqrt(enc.output_size())
        self.lookahead, self.up = enc.pre_lookahead_layer, enc.up_layer
        self.stride = int(self.up.stride)
        self.first = _RelAttentionStack(enc.encoders, CHUNK, slots)
        self.second = _RelAttentionStack(enc.up_encoders, CHUNK * self.stride, slots * self.stride)
        self.after_norm, self.proj = enc.after_norm, flow.encoder_proj
        keep = torch.ones(CHUNK + LOOKAHEAD, 1)
        self.register_buffer("lookahead_rows", torch.cat((torch.zeros(CHUNK, 1), keep[CHUNK:])), persistent=False)

    def _embed(self, seq, x):
        linear, norm = seq[0], seq[1]
        return _layer_norm(linear(x), norm, norm.eps) * self.scale

    def forward(self, tokens, att_cache1, att_cache2, cnn_cache, cache_len, last_chunk):
        x = self._embed(self.embed, self.embedding(tokens))  # [1, 28, C]
        x = x * (1.0 - last_chunk * self.lookahead_rows)
        # pre-lookahead: conv1 sees the lookahead, conv2 two cached rows of conv1's output
        la = self.lookahead
        y = F.leaky_relu(F.conv1d(x.transpose(1, 2), la.conv1.weight, la.conv1.bias), 0.01)  # [1, C, 25]
        y2 = F.conv1d(torch.cat((cnn_cache[:, :, :2], y), dim=2), la.conv2.weight, la.conv2.bias)
        x = y2.transpose(1, 2) + x[:, :CHUNK]
        x, new1 = self.first(x, att_cache1, cache_len)
        # upsample x2 (nearest), 4 cached rows in front, k=5 conv
        up = torch.repeat_interleave(x.transpose(1, 2), self.stride, dim=2)
        padded = torch.cat((cnn_cache[:, :, 2:], up), dim=2)
        x = F.conv1d(padded, self.up.conv.weight, self.up.conv.bias).transpose(1, 2)  # [1, 50, C]
        x, new2 = self.second(self._embed(self.up_embed, x), att_cache2, cache_len * self.stride)
        h = self.proj(_layer_norm(x, self.after_norm, self.after_norm.eps))
        cnn = torch.cat((y[:, :, -2:], padded[:, :, -2 * self.stride:]), dim=2)
        return h.transpose(1, 2), new1, new2, cnn


def _columns(x, start, width: int):
    """Columns start .. start + width - 1 of x [1, C, T], `start` a [1] tensor."""
    return torch.index_select(x, 2, start + torch.arange(width))


class FlowEncoderLast(FlowEncoder):
    """The stream's last call (`inference_chunk(..., last_chunk=True)`, the official driver's flush):
    tokens [1, 28] (the first `length` real, 1..28, the rest any id), the caches and cache_len as
    `FlowEncoder` takes them, length [1] -> mu [1, 80, 56], its first 2 `length` frames real and
    the rest zero; the new att rows [L1,1,H,28,2dk] / [L2,1,H,56,2dk] (the first `length` / 2
    `length` real, the rest zero) and the new cnn_cache, the caches the official call leaves (the
    official driver calls once more after a last 28-token call). The official call embeds the
    `length` tokens, pads 3 zero rows after them (no lookahead follows) and runs every row; here the
    rows past `length` are zeroed before the lookahead conv (so the real rows see the same zeros),
    and are no keys in either conformer stack (the convs are causal: the real rows never read them);
    the conv caches are the rows at the real end. After a 1-token call the official pre-lookahead
    cache holds one row (its next call fails); here it holds the cached row before it too."""

    def __init__(self, flow: nn.Module, slots: int):
        super().__init__(flow, slots)
        self.capacity = CHUNK + LOOKAHEAD
        enc = flow.encoder
        self.first = _RelAttentionStack(enc.encoders, self.capacity, slots)
        self.second = _RelAttentionStack(enc.up_encoders, self.capacity * self.stride, slots * self.stride)

    def forward(self, tokens, att_cache1, att_cache2, cnn_cache, cache_len, length):
        x = self._embed(self.embed, self.embedding(tokens))
        x = x * (torch.arange(self.capacity) < length).to(x.dtype)[None, :, None]  # [1, 28, C]
        la = self.lookahead
        padded = F.pad(x.transpose(1, 2), (0, LOOKAHEAD))  # the official zero lookahead rows
        y = F.leaky_relu(F.conv1d(padded, la.conv1.weight, la.conv1.bias), 0.01)  # [1, C, 28]
        y = torch.cat((cnn_cache[:, :, :2], y), dim=2)
        y2 = F.conv1d(y, la.conv2.weight, la.conv2.bias)
        x = y2.transpose(1, 2) + x
        x, new1 = self.first(x, att_cache1, cache_len, length)
        up = torch.repeat_interleave(x.transpose(1, 2), self.stride, dim=2)
        up = torch.cat((cnn_cache[:, :, 2:], up), dim=2)
        x = F.conv1d(up, self.up.conv.weight, self.up.conv.bias).transpose(1, 2)
        x, new2 = self.second(self._embed(self.up_embed, x), att_cache2, cache_len * self.stride, length * self.stride)
        h = self.proj(_layer_norm(x, self.after_norm, self.after_norm.eps))
        frames = (torch.arange(self.capacity * self.stride) < length * self.stride).to(h.dtype)
        rows = (torch.arange(self.capacity) < length).to(h.dtype)
        cnn = torch.cat((_columns(y, length, 2), _columns(up, self.stride * length, 2 * self.stride)), dim=2)
        return (h * frames[None, :, None]).transpose(1, 2), new1 * rows[:, None], new2 * frames[:, None], cnn


TRIM_FRAMES = 100  # Token2wav's `stream` keeps the prompt + the last 100 frames of each attention cache


def trim_time(cache, dim: int, prompt_frames: int):
    """Token2wav `stream`'s trimming of an attention cache along its time axis (its slices, as they are)."""
    if cache.shape[dim] <= prompt_frames + TRIM_FRAMES:
        return cache
    return torch.cat((cache.narrow(dim, 0, prompt_frames), cache.narrow(dim, cache.shape[dim] - TRIM_FRAMES, TRIM_FRAMES)), dim)


def graph_caches(att, layers1: int, slots: int, up: int):
    """The official `conformer_att_cache` as `flow_encoder`'s right-aligned inputs: (att_cache1,
    att_cache2, cache_len); the first stack uses the first half of its doubled rows, as the official
    unpacking does."""
    n = att.shape[3] // 2
    if n > slots:
        raise EdgexError(f"encoder cache of {n} rows exceeds the graph's {slots} slots: the voice prompt is longer "
                         f"than the export's max_prompt ({slots - 50} tokens); export with --set max_prompt=N")
    att1 = torch.zeros(layers1, *att.shape[1:3], slots, att.shape[4])
    att2 = torch.zeros(att.shape[0] - layers1, *att.shape[1:3], up * slots, att.shape[4])
    att1[:, :, :, slots - n:] = att[:layers1, :, :, :n]
    att2[:, :, :, up * (slots - n):] = att[layers1:]
    return att1, att2, torch.tensor([n])


def dit_caches(att, cnn, steps: int, slots: int):
    """The official DiT streaming caches (`estimator_att_cache` [>= N, depth, 2, H, n, 2 hd],
    `estimator_cnn_cache`) as `flow_chunk`'s inputs: the first `steps` rows, the n real key | value
    rows left-aligned in `slots` slots, steps and blocks merged ([N * depth, 2, H, slots, 2 hd]:
    rank 5 for Core ML), and n."""
    n = att.shape[4]
    if n > slots:
        raise EdgexError(f"DiT cache of {n} frames exceeds the graph's {slots} slots: the voice prompt is longer "
                         f"than the export's max_prompt ({slots // 2 - 50} tokens); export with --set max_prompt=N")
    # `steps` rows of its own: a slice of an all-rows tensor would keep the official buffer's 16
    # rows alive in every sample (1.6x the input at 10 steps, 0.32 GB a call at the 4.5 preset)
    padded = torch.zeros(steps, *att.shape[1:4], slots, att.shape[5])
    padded[..., :n, :] = att[:steps]
    return padded.reshape(-1, *padded.shape[2:]), cnn[:steps].clone(), torch.tensor([n])


def official_cache(att_cache1, att_cache2, cache_len: int):
    """The official `conformer_att_cache` of the right-aligned graph caches (None when empty):
    the first stack's rows stored twice along time, then the second stack's."""
    if cache_len == 0:
        return None
    c1 = att_cache1[:, :, :, att_cache1.shape[3] - cache_len:]
    c2 = att_cache2[:, :, :, att_cache2.shape[3] - 2 * cache_len:]
    return torch.cat((torch.cat((c1, c1), dim=3), c2), dim=0)


@torch.no_grad()
def encoder_reference(flow, tokens, att_cache1, att_cache2, cnn_cache, cache_len, last_chunk):
    """The official `encoder.forward_chunk` + `encoder_proj` (what `inference_chunk` runs) on the
    valid part of the caches; its returned caches reduced to the rows the call wrote."""
    n = int(cache_len.reshape(-1)[0])
    last = bool(float(last_chunk.reshape(-1)[0]) > 0)
    xs = flow.input_embedding(tokens[:, :CHUNK] if last else tokens)
    h, cnn, att = flow.encoder.forward_chunk(xs, last_chunk=last, cnn_cache=cnn_cache if n else None,
                                             att_cache=official_cache(att_cache1, att_cache2, n))
    layers1 = att_cache1.shape[0]
    new1 = att[:layers1, :, :, n:n + CHUNK]
    new2 = att[layers1:, :, :, -2 * CHUNK:]
    return flow.encoder_proj(h).transpose(1, 2), new1, new2, cnn


@torch.no_grad()
def encoder_last_reference(flow, tokens, att_cache1, att_cache2, cnn_cache, cache_len, length):
    """The official `encoder.forward_chunk(last_chunk=True)` + `encoder_proj` on the first `length`
    tokens and the valid part of the caches; mu and the new att rows zero-padded to the graph's 28
    tokens / 56 frames, and the new cnn_cache (its pre-lookahead rows behind the input's, which
    only a 1-token call reaches)."""
    n, count = int(cache_len.reshape(-1)[0]), int(length.reshape(-1)[0])
    h, cnn, att = flow.encoder.forward_chunk(flow.input_embedding(tokens[:, :count]), last_chunk=True,
                                             cnn_cache=cnn_cache if n else None,
                                             att_cache=official_cache(att_cache1, att_cache2, n))
    mu = flow.encoder_proj(h).transpose(1, 2)
    width, layers1 = tokens.shape[1], att_cache1.shape[0]
    new1 = F.pad(att[:layers1, :, :, n:n + count], (0, 0, 0, width - count))
    new2 = F.pad(att[layers1:, :, :, att.shape[3] - 2 * count:], (0, 0, 0, 2 * (width - count)))
    before = cnn_cache[:, :, :2] if n else torch.zeros_like(cnn_cache[:, :, :2])
    lookahead = torch.cat((before, cnn[:, :, :cnn.shape[2] - 4]), dim=2)[:, :, -2:]
    return F.pad(mu, (0, 2 * width - mu.shape[2])), new1, new2, torch.cat((lookahead, cnn[:, :, -4:]), dim=2)
