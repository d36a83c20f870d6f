"""Token2wav's flow-matching decoder as graphs: one CFG Euler step (`FlowStep`), the whole loop
(`Flow`, non-streaming) and one streaming chunk of the whole loop with the DiT's caches (`FlowChunk`).

The math is written here from the official `DiT` / `CausalConditionalCFM` (stepaudio2 1.0.5) and
uses only the official modules' parameters, never their forwards (those are the reference):
  * timestep: sinusoidal features of 1000 t (cos | sin, 256 wide) through `t_embedder.mlp`;
  * input: [x | mu | spks repeated over time | cond] (4 x 80 = 320 channels) through `in_proj`;
  * block (adaLN-zero with 9 modulations): attention (q/k LayerNorm per head, no mask: every frame
    of a call is valid), then a causal conv block (k=3 conv, LayerNorm, Mish, k=3 conv), then a
    tanh-GELU MLP, each gated; `final_layer` modulates and projects back to 80 mel bins;
  * classifier-free guidance as a batch of 2: (x, mu, spks, cond) and (x, 0, 0, 0) at the same t,
    v = 1.7 v_cond - 0.7 v_uncond (rate 0.7), x += dt v;
  * schedule: t_span = 1 - cos(pi/2 linspace(0, 1, N + 1)); the loop advances t by dt and takes the
    next dt against the grid, exactly the official recurrence (float32), so the grid is a constant.
Streaming (`forward_chunk`): each block's attention also sees the cached key | value rows of
earlier chunks ([new | cache], masked to the real rows; the DiT has no positional encoding) and
its two causal convs start from the previous chunk's last two input rows instead of zeros; the
caches are per Euler step and per guidance row.
The noise is an input: the official non-streaming call slices its construction-time
`rand_noise` [1, 80, 30000] buffer from frame 0 (streaming: from the cached length), so a runner
that wants the official output passes that slice.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

FREQ_DIM = 256  # TimestepEmbedder.frequency_embedding_size
T_SCALE = 1000.0  # TimestepEmbedder.scale


def cosine_schedule(steps: int) -> list[tuple[float, float]]:
    """(t, dt) of each Euler step, as the official loop computes them in float32."""
    grid = 1 - torch.cos(torch.linspace(0, 1, steps + 1, dtype=torch.float32) * 0.5 * torch.pi)
    t, dt, out = grid[0], grid[1] - grid[0], []
    for step in range(1, steps + 1):
        out.append((float(t), float(dt)))
        t = t + dt
        if step < steps:
            dt = grid[step + 1] - t
    return out


def _layer_norm(x, norm: nn.Module | None = None, eps: float = 1e-6):
    mean = x.mean(dim=-1, keepdim=True)
    centered = x - mean
    out = centered * torch.rsqrt((centered * centered).mean(dim=-1, keepdim=True) + eps)
    return out if norm is None else out * norm.weight + norm.bias


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def _mish(x):
    return x * torch.tanh(F.softplus(x))


def _silu(x):
    return x * torch.sigmoid(x)


def _causal_conv(conv: nn.Conv1d, x, cache=None, end=None):
    """[B, T, C] -> [B, T, C'] and the last kernel - 1 input rows (those before row `end` [1] of x
    when given: the real rows end there); left-padded by those rows of the previous chunk (`cache`
    [B, kernel - 1, C]) or by zeros."""
    pad = conv.kernel_size[0] - 1
    x = F.pad(x, (0, 0, pad, 0)) if cache is None else torch.cat((cache, x), dim=1)
    y = F.conv1d(x.transpose(1, 2), conv.weight, conv.bias)
    return y.transpose(1, 2), x[:, -pad:] if end is None else torch.index_select(x, 1, end + torch.arange(pad))


class DiTVelocity(nn.Module):
    """The DiT estimator: (x, mu, spks, cond) [B, 80, T] / [B, 80], t [B] -> velocity [B, 80, T]."""

    def __init__(self, estimator: nn.Module):
        super().__init__()
        self.est = estimator
        half = FREQ_DIM // 2
        self.register_buffer("freqs", torch.exp(-math.log(10000) * torch.arange(half, dtype=torch.float32) / half),
                             persistent=False)

    def _attention(self, attn, x, cache=None, keep=None):
        """Self-attention of the call's frames; with `cache` [B, H, S, 2 hd] (key | value rows of
        earlier chunks, `keep` [S + T] marking the real ones) the keys are [new | cache], the
        official streaming order. Returns the output and the new rows' key | value."""
        b, t, _ = x.shape
        heads, hd = attn.num_heads, attn.head_dim

        def split(lin, norm):
            return _layer_norm(lin(x).reshape(b, t, heads, hd).transpose(1, 2), norm, norm.eps)

        q, k, v = split(attn.to_q, attn.q_norm), split(attn.to_k, attn.k_norm), attn.to_v(x).reshape(b, t, heads, hd).transpose(1, 2)
        new = torch.cat((k, v), dim=-1)
        if cache is not None:
            k, v = torch.cat((k, cache[..., :hd]), dim=2), torch.cat((v, cache[..., hd:]), dim=2)
        scores = torch.matmul(q, k.transpose(2, 3)) * (hd ** -0.5)
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1), v).transpose(1, 2).reshape(b, t, heads * hd)
        return attn.proj(out), new

    def _conv_block(self, block, x, cache=None, end=None):
        """Two causal k=3 convs; `cache` [B, C1 + C2, 2]: the last two input rows of each conv from
        the previous chunk (zeros: the non-streaming left padding). Returns the new cache too (the
        rows before frame `end` when given)."""
        seq = block.block
        c1 = seq[1].in_channels
        first, second = (None, None) if cache is None else (cache[:, :c1].transpose(1, 2), cache[:, c1:].transpose(1, 2))
        x, tail1 = _causal_conv(seq[1], x, first, end)
        x = _mish(_layer_norm(x, seq[3], seq[3].eps))
        x, tail2 = _causal_conv(seq[6], x, second, end)
        return x, torch.cat((tail1, tail2), dim=2).transpose(1, 2)

    def forward(self, x, mu, spks, cond, t, att_cache=None, cnn_cache=None, keep=None, end=None):
        """Velocity; with the streaming caches (per block: att_cache [depth, B, H, S, 2 hd], cnn_cache
        [depth, B, 2 C, 2], `keep` the real key slots, `end` [1] the real frames when fewer than T)
        it also returns each block's new rows."""
        est = self.est
        args = (t * T_SCALE)[:, None] * self.freqs[None]
        mlp = est.t_embedder.mlp
        c = mlp[2](_silu(mlp[0](torch.cat((torch.cos(args), torch.sin(args)), dim=-1))))[:, None]  # [B, 1, H]
        frames = x.shape[2]
        h = torch.cat((x, mu, spks[:, :, None].expand(-1, -1, frames), cond), dim=1).transpose(1, 2)
        h = est.in_proj(h)
        new_att, new_cnn = [], []
        for i, blk in enumerate(est.blocks):
            mod = blk.adaLN_modulation[1](_silu(c)).chunk(9, dim=-1)
            shift_a, scale_a, gate_a, shift_m, scale_m, gate_m, shift_c, scale_c, gate_c = mod
            streaming = att_cache is not None
            out, rows = self._attention(blk.attn, _layer_norm(h) * (1 + scale_a) + shift_a,
                                        att_cache[i] if streaming else None, keep)
            h = h + gate_a * out
            out, tail = self._conv_block(blk.conv, _layer_norm(h) * (1 + scale_c) + shift_c,
                                         cnn_cache[i] if streaming else None, end)
            h = h + gate_c * out
            h = h + gate_m * blk.mlp.fc2(_gelu_tanh(blk.mlp.fc1(_layer_norm(h) * (1 + scale_m) + shift_m)))
            new_att.append(rows)
            new_cnn.append(tail)
        final = est.final_layer
        shift, scale = final.adaLN_modulation[1](_silu(c)).chunk(2, dim=-1)
        v = final.linear(_layer_norm(h) * (1 + scale) + shift).transpose(1, 2)
        return (v, torch.stack(new_att), torch.stack(new_cnn)) if att_cache is not None else v


class _Guided(nn.Module):
    def __init__(self, cfm: nn.Module):
        super().__init__()
        self.velocity = DiTVelocity(cfm.estimator)
        self.rate = float(cfm.inference_cfg_rate)

    def step(self, x, mu, spks, cond, t, dt, att_cache=None, cnn_cache=None, keep=None, end=None):
        out = self.velocity(torch.cat((x, x)), torch.cat((mu, torch.zeros_like(mu))),
                            torch.cat((spks, torch.zeros_like(spks))), torch.cat((cond, torch.zeros_like(cond))),
                            torch.cat((t, t)), att_cache, cnn_cache, keep, end)
        both, rows = (out, None) if att_cache is None else (out[0], out[1:])
        v_cond, v_uncond = both[:1], both[1:]
        x = x + dt * ((1.0 + self.rate) * v_cond - self.rate * v_uncond)
        return x if rows is None else (x, *rows)


class FlowStep(_Guided):
    """x, mu, cond [1, 80, T], spks [1, 80] (projected speaker), t [1], dt [1] -> next x [1, 80, T]."""

    def forward(self, x, mu, spks, cond, t, dt):
        return self.step(x, mu, spks, cond, t, dt)


class Flow(_Guided):
    """noise, mu, cond [1, 80, T], spks [1, 80] -> mel [1, 80, T] after `steps` Euler steps."""

    def __init__(self, cfm: nn.Module, steps: int):
        super().__init__(cfm)
        self.schedule = cosine_schedule(steps)

    def forward(self, noise, mu, spks, cond):
        x = noise
        for t, dt in self.schedule:
            x = self.step(x, mu, spks, cond, torch.full((1,), t, dtype=x.dtype), torch.full((1,), dt, dtype=x.dtype))
        return x


class FlowChunk(_Guided):
    """One streaming chunk of the CFM (what `CausalConditionalCFM.forward_chunk` computes): noise,
    mu [1, 80, T], spks [1, 80], att_cache [N * depth, 2, H, S, 2 hd] (per Euler step and block,
    step-major, both guidance rows: key | value of earlier frames, the first `cache_len` slots real,
    newest first as the official cache grows), cnn_cache [N, depth, 2, 2 C, 2], cache_len [1] -> mel
    [1, 80, T], the new rows [N * depth, 2, H, T, 2 hd] and the new cnn_cache. The condition is zero
    (Token2wav's streaming call passes zeros; the prompt reaches the DiT through the caches).

    The official attention cache is [N, depth, 2, H, S, 2 hd]; its first two axes are merged here
    because Core ML holds tensors of rank <= 5 only (the rank-6 layout failed its conversion)."""

    def __init__(self, cfm: nn.Module, steps: int, slots: int):
        super().__init__(cfm)
        self.schedule = cosine_schedule(steps)
        self.slots = slots

    def forward(self, noise, mu, spks, att_cache, cnn_cache, cache_len):
        frames = noise.shape[2]
        keep = torch.cat((torch.ones(frames, dtype=torch.bool), torch.arange(self.slots) < cache_len))
        depth = len(self.velocity.est.blocks)
        x, cond, rows, tails = noise, torch.zeros_like(mu), [], []
        for i, (t, dt) in enumerate(self.schedule):
            x, new, tail = self.step(x, mu, spks, cond, torch.full((1,), t, dtype=x.dtype), torch.full((1,), dt, dtype=x.dtype),
                                     att_cache[i * depth:(i + 1) * depth], cnn_cache[i], keep)
            rows.append(new)
            tails.append(tail)
        return x, torch.cat(rows), torch.stack(tails)


class FlowChunkLast(FlowChunk):
    """The stream's last call of the CFM: noise, mu [1, 80, F] (F = 56, two frames per token of the
    28 a last call can hold; the first `frames` real), spks, att_cache, cnn_cache, cache_len as
    `FlowChunk` takes them, frames [1] -> mel [1, 80, F], its first `frames` real and the rest zero;
    the new rows [N * depth, 2, H, F, 2 hd] (the first `frames` real, the rest zero) and the new
    cnn_cache (the conv rows at the real end), the caches the official call leaves. Frames past
    `frames` are no keys (the DiT's convs are causal: the real frames never read them), so the real
    frames are those of an official call on `frames` frames."""

    def forward(self, noise, mu, spks, att_cache, cnn_cache, cache_len, frames):
        width = noise.shape[2]
        real = torch.arange(width) < frames
        keep = torch.cat((real, torch.arange(self.slots) < cache_len))
        depth = len(self.velocity.est.blocks)
        x, cond, rows, tails = noise, torch.zeros_like(mu), [], []
        for i, (t, dt) in enumerate(self.schedule):
            x, new, tail = self.step(x, mu, spks, cond, torch.full((1,), t, dtype=x.dtype), torch.full((1,), dt, dtype=x.dtype),
                                     att_cache[i * depth:(i + 1) * depth], cnn_cache[i], keep, frames)
            rows.append(new)
            tails.append(tail)
        real = real.to(x.dtype)
        return x * real, torch.cat(rows) * real[:, None], torch.stack(tails)


@torch.no_grad()
def chunk_reference(cfm, steps: int, noise, mu, spks, att_cache, cnn_cache, cache_len):
    """The official `CausalConditionalCFM.forward_chunk` on the real cache rows, its noise buffer
    holding `noise` where the call slices it (from the cache length); the rows it wrote (the first
    T of its returned attention cache, steps and blocks merged as the graph returns them) and its
    conv cache."""
    n = int(cache_len.reshape(-1)[0])
    att_cache = att_cache.reshape(steps, -1, *att_cache.shape[1:])  # the official [N, depth, 2, H, S, 2 hd]
    kept = cfm.rand_noise
    cfm.rand_noise = torch.cat((torch.zeros(1, noise.shape[1], n), noise), dim=2)
    try:
        mel, cnn, att = cfm.forward_chunk(mu, spks, torch.zeros_like(mu), n_timesteps=steps,
                                          cnn_cache=cnn_cache if n else None, att_cache=att_cache[..., :n, :] if n else None)
    finally:
        cfm.rand_noise = kept
    rows = att[:steps, ..., :noise.shape[2], :]
    return mel, rows.reshape(-1, *rows.shape[2:]).clone(), cnn[:steps].clone()


@torch.no_grad()
def chunk_last_reference(cfm, steps: int, noise, mu, spks, att_cache, cnn_cache, cache_len, frames):
    """The official `forward_chunk` on the first `frames` frames of mu (its noise the first
    `frames` of `noise`): the mel and the rows it wrote zero-padded to the graph's width, its conv
    cache."""
    count = int(frames.reshape(-1)[0])
    mel, rows, cnn = chunk_reference(cfm, steps, noise[..., :count], mu[..., :count], spks, att_cache, cnn_cache, cache_len)
    pad = noise.shape[2] - count
    return F.pad(mel, (0, pad)), F.pad(rows, (0, 0, 0, pad)), cnn


@torch.no_grad()
def step_reference(cfm, x, mu, spks, cond, t, dt):
    """The official `solve_euler` over the two-point grid [t, t + dt]: one guided step."""
    frames = x.shape[2]
    return (cfm.solve_euler(x, torch.cat((t, t + dt)), mu, torch.ones(1, 1, frames), spks, cond),)


@torch.no_grad()
def flow_reference(cfm, steps: int, noise, mu, spks, cond):
    """The official `CausalConditionalCFM.forward` with its `rand_noise` buffer holding `noise`
    (it slices frames [0, T) of that buffer: the non-streaming path)."""
    kept = cfm.rand_noise
    cfm.rand_noise = noise
    try:
        return (cfm.forward(mu, torch.ones(1, 1, mu.shape[2]), spks, cond, n_timesteps=steps),)
    finally:
        cfm.rand_noise = kept
