"""A streaming runner over the vocoder graphs: what a device runs per 25-token chunk.

It keeps the caches Token2wav's `stream` keeps, with the same bookkeeping: the conformer caches
in the official layout (the first stack's rows stored twice along time, trimmed to the prompt +
100 frames), the CFM noise offset (the DiT cache length, trimmed the same way), HiFT's 8 cached
mel frames and 3840 cached source samples, and the 3840-sample Hamming cross-fade of consecutive
chunks. The numbers come from the graphs it is given (`flow_encoder`, `flow`, `hift` as torch
modules or as artifacts behind the same call), never from the official modules.
"""

from __future__ import annotations

import numpy as np
import torch

from .encoder import dit_caches, graph_caches, trim_time
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
