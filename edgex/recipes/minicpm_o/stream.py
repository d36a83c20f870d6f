"""A streaming runner over the vocoder graphs: what a device runs per call of Token2wav's `stream`.

It keeps the caches Token2wav's `stream` keeps, with the same bookkeeping: the conformer caches
in the official layout (the first stack's rows stored twice along time, trimmed to the prompt +
100 frames), the CFM noise offset (the DiT cache length, trimmed the same way), HiFT's 8 cached
mel frames and 3840 cached source samples, and the 3840-sample Hamming cross-fade of consecutive
chunks. The numbers come from the graphs it is given (`flow_encoder`, `flow`, `hift` as torch
modules or as artifacts behind the same call), never from the official modules.

`GraphStream` is the whole call: a regular call (25 + 3 lookahead tokens) runs `flow_encoder` ->
`flow_chunk`, a last one (1..28 tokens, the driver's flush) `flow_encoder_last` ->
`flow_chunk_last`, and every call `hift_stream` (its frames zero-padded to the graph's width).
Every call grows the caches as the official one does, a last call too: MiniCPM-o's driver calls
once more after a last-flagged 28-token call, with the tokens from its 26th on.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from ...errors import EdgexError
from .encoder import CHUNK, LOOKAHEAD, dit_caches, graph_caches, trim_time
from .hift import CACHE_FRAMES


def _crossfade(speech, previous, window):
    """Token2wav's `fade_in_out`: the new chunk's head faded in over the previous chunk's tail."""
    half = window.shape[0] // 2
    out = speech.clone()
    out[..., :half] = speech[..., :half] * window[:half] + previous[..., -half:] * window[half:]
    return out


class VocoderStream:
    """`hift(mel, noise, cache_source, use_cache) -> (wav, source)` per chunk, plus the cross-fade:
    shared by the graph chain and the official path, so the two differ only in their graphs."""

    def __init__(self, hift, upsample: int):
        self.hift, self.upsample = hift, upsample
        self.cache_samples = CACHE_FRAMES * upsample
        self.window = torch.from_numpy(np.hamming(2 * self.cache_samples)).to(torch.float32)
        self.mel = self.source = self.speech = None
        self.out = []

    def push(self, chunk_mel, noise, last: bool):
        mel = chunk_mel if self.mel is None else torch.cat((self.mel, chunk_mel), dim=2)
        cache = torch.zeros(1, 1, self.cache_samples) if self.source is None else self.source
        use = torch.tensor([0.0 if self.source is None else 1.0])
        speech, source = self.hift(mel, noise[:, : mel.shape[2] * self.upsample], cache, use)
        first = self.speech is None
        if not first:
            speech = _crossfade(speech, self.speech, self.window)
        self.mel, self.source = mel[..., -CACHE_FRAMES:], source[:, :, -self.cache_samples:]
        self.speech = speech[:, -self.cache_samples:]
        if not last:
            tail = speech[:, :-self.cache_samples]
            speech = torch.cat((torch.zeros(1, self.cache_samples), tail), dim=1) if first else tail
        self.out.append(speech)

    def wav(self) -> torch.Tensor:
        return torch.cat(self.out, dim=1)


class EncoderCaches:
    """The conformer caches in Token2wav's layout, fed to `flow_encoder` right-aligned in its slots
    and grown from the rows it returns, trimmed as `stream` trims them."""

    def __init__(self, setup_cache: dict, prompt_frames: int, layers1: int, slots: int, up: int):
        self.att, self.cnn = setup_cache["conformer_att_cache"], setup_cache["conformer_cnn_cache"]
        self.prompt_frames, self.layers1, self.slots, self.up = prompt_frames, layers1, slots, up

    def inputs(self):
        att1, att2, n = graph_caches(self.att, self.layers1, self.slots, self.up)
        return att1, att2, self.cnn, n

    def update(self, new1, new2, cnn):
        n = self.att.shape[3] // 2
        first = torch.cat((self.att[:self.layers1, :, :, :n], new1), dim=3)
        second = torch.cat((self.att[self.layers1:], new2), dim=3)
        self.att = trim_time(torch.cat((torch.cat((first, first), dim=3), second), dim=0), 3, self.prompt_frames)
        self.cnn = cnn


class DiTCaches:
    """The CFM's per-step DiT caches in Token2wav's layout (newest rows first), fed to `flow_chunk`
    left-aligned in its slots, grown from the rows it returns and trimmed as `stream` trims them.
    Their length is also where the official call slices its noise buffer (`offset`)."""

    def __init__(self, setup_cache: dict, prompt_frames: int, steps: int, slots: int):
        self.att, self.cnn = setup_cache["estimator_att_cache"][:steps], setup_cache["estimator_cnn_cache"][:steps]
        self.prompt_frames, self.steps, self.slots = prompt_frames, steps, slots

    @property
    def offset(self) -> int:
        return self.att.shape[4]

    def inputs(self):
        return dit_caches(self.att, self.cnn, self.steps, self.slots)

    def update(self, rows, cnn):
        rows = rows.reshape(self.steps, -1, *rows.shape[1:])  # the graph's [N * depth, ...] -> [N, depth, ...]
        self.att = trim_time(torch.cat((rows, self.att), dim=4), 4, self.prompt_frames)
        self.cnn = cnn


def fixed_width(hift_stream, width: int, upsample: int):
    """`hift(mel, noise, cache_source, use_cache)` of any length up to `width` frames through the
    `hift_stream` graph: inputs zero-padded to its width, outputs cut to the real samples."""

    def call(mel, noise, cache_source, use_cache):
        frames = mel.shape[2]
        if frames > width:
            raise EdgexError(f"a HiFT call of {frames} frames exceeds the hift_stream graph's {width}")
        wav, source = hift_stream(F.pad(mel, (0, width - frames)), F.pad(noise, (0, 0, 0, (width - frames) * upsample)),
                                  cache_source, use_cache, torch.tensor([frames]))
        return wav[:, :frames * upsample], source[:, :, :frames * upsample]

    return call


class GraphStream:
    """Token2wav's `stream(tokens, last_chunk)` over the graphs, after its `set_stream_cache`
    (`setup_cache`: the official prompt caches, `prompt_frames` 50 Hz frames of prompt).

    `graphs` maps `flow_encoder`, `flow_chunk`, `flow_encoder_last`, `flow_chunk_last` and
    `hift_stream` to callables on torch tensors returning a tuple of outputs (torch modules or
    artifacts behind that call); `noise_buffer` is the CFM's `rand_noise` (sliced from the DiT
    cache's length, as the official call slices it), `spks` the projected speaker embedding,
    `hift_noise(samples)` the sine source noise of each call."""

    def __init__(self, graphs: dict, setup_cache: dict, prompt_frames: int, *, layers1: int, steps: int, slots: int,
                 up: int, noise_buffer, spks, hift_noise, hift_frames: int, upsample: int):
        self.graphs, self.up, self.spks, self.noise_buffer, self.hift_noise = graphs, up, spks, noise_buffer, hift_noise
        # the official CFM returns views of its scratch buffers, which its next call overwrites
        setup_cache = {k: v.clone() for k, v in setup_cache.items()}
        self.encoder = EncoderCaches(setup_cache, prompt_frames, layers1, slots, up)
        self.dit = DiTCaches(setup_cache, prompt_frames, steps, up * slots)
        self.vocoder = VocoderStream(fixed_width(graphs["hift_stream"], hift_frames, upsample), upsample)

    def _noise(self, frames: int):
        return self.noise_buffer[:, :, self.dit.offset:self.dit.offset + frames]

    def __call__(self, tokens, last_chunk: bool) -> torch.Tensor:
        count, capacity = len(tokens), CHUNK + LOOKAHEAD
        if not last_chunk and count != capacity:
            raise EdgexError(f"a streaming call takes {CHUNK} + {LOOKAHEAD} lookahead tokens unless it is the last (got {count})")
        if not 1 <= count <= capacity:
            raise EdgexError(f"a last streaming call takes 1..{capacity} tokens (got {count})")
        ids = torch.tensor([list(tokens)], dtype=torch.int64)
        g = self.graphs
        if not last_chunk:
            mu, new1, new2, cnn = g["flow_encoder"](ids, *self.encoder.inputs(), torch.tensor([0.0]))
            self.encoder.update(new1, new2, cnn)
            mel, rows, tails = g["flow_chunk"](self._noise(mu.shape[2]), mu, self.spks, *self.dit.inputs())
            self.dit.update(rows, tails)
        else:
            padded = F.pad(ids, (0, capacity - count))
            mu, new1, new2, cnn = g["flow_encoder_last"](padded, *self.encoder.inputs(), torch.tensor([count]))
            frames = self.up * count
            self.encoder.update(new1[..., :count, :], new2[..., :frames, :], cnn)
            mel, rows, tails = g["flow_chunk_last"](self._noise(mu.shape[2]), mu, self.spks, *self.dit.inputs(),
                                                    torch.tensor([frames]))
            mel = mel[:, :, :frames]
            self.dit.update(rows[..., :frames, :], tails)
        start = len(self.vocoder.out)
        mel_frames = mel.shape[2] + (0 if self.vocoder.mel is None else self.vocoder.mel.shape[2])
        self.vocoder.push(mel, self.hift_noise(mel_frames * self.vocoder.upsample), last_chunk)
        return self.vocoder.out[start]


def driver_calls(count: int) -> list[tuple[int, int, bool]]:
    """MiniCPM-o's Token2wav loop over `count` audio tokens as (start, end, last_chunk) calls: 25 +
    3 lookahead tokens per call while that many are left (`last_chunk` when they are the last),
    advancing 25, then the rest in one last call."""
    calls, pos, width = [], 0, CHUNK + LOOKAHEAD
    while pos + width <= count:
        calls.append((pos, pos + width, pos + width >= count))
        pos += CHUNK
    if pos < count:
        calls.append((pos, count, True))
    return calls
