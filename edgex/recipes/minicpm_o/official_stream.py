"""Token2wav's own streaming calls on the recipe's vocoder: the reference of a whole streamed utterance.

`Token2wav.set_stream_cache` and `Token2wav.stream` (stepaudio2 1.0.5, `token2wav.py`) are what
MiniCPM-o's streaming driver calls: the prompt through the flow model's `setup_cache`, then per call
`inference_chunk`, the official cache trimming, HiFT with its mel / source cache, the Hamming
cross-fade and the tail kept for the next call (a last call returns it). Here they run unmodified
on the CPU, with three things around them:
  * `token2wav.py` imports the prompt front end at module level (torchaudio, s3tokenizer,
    hyperpyyaml, librosa's mel filters), used only by `__init__` (loading files), `_prepare_prompt`
    (prompt wav -> tokens, speaker embedding, mel) and `__call__`; the file is loaded with
    placeholders for them, a `Token2wav` is made without `__init__` (its flow model, HiFT and the
    stream constants `__init__` sets), and `_prepare_prompt` returns the given prompt tokens, mel
    and speaker embedding;
  * the file's `device='cuda'` arguments are dropped (its `torch` seen through `_OnCpu`);
  * HiFT's random draws are fixed per call (`hift_reference`): the sine source noise from
    `hift_noise(samples)`, drawn in call order, which the graph runner draws the same way.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import sys
import warnings
from functools import cache

import numpy as np
import torch

from ...errors import EdgexError
from ...patches.imports import Placeholder
from .hift import CACHE_FRAMES, hift_reference
from .stepaudio2_import import package_placeholders, stepaudio2_modules

_FRONT_END = ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi", "s3tokenizer", "hyperpyyaml",
              "stepaudio2.flashcosyvoice.utils", "stepaudio2.flashcosyvoice.utils.audio")


@cache
def token2wav_class() -> type:
    """stepaudio2's `Token2wav`, its module loaded with placeholders for the front end it imports."""
    stepaudio2_modules()  # the vocoder's own modules
    front_end = {name: Placeholder(name, "Token2wav's prompt front end is not part of edgex's vocoder reference")
                 for name in _FRONT_END}
    for name, module in front_end.items():  # a placeholder package holds its placeholder children
        parent, _, child = name.rpartition(".")
        if parent in front_end:
            front_end[parent].__dict__[child] = module
    with package_placeholders(front_end):
        module = importlib.import_module("stepaudio2.token2wav")
    return module.Token2wav


class _OnCpu:
    """`torch` as `token2wav.py` sees it, its tensor constructors' `device` dropped."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def tensor(self, *args, device=None, **kwargs):
        return self._real.tensor(*args, **kwargs)

    def zeros(self, *args, device=None, **kwargs):
        return self._real.zeros(*args, **kwargs)

    def ones(self, *args, device=None, **kwargs):
        return self._real.ones(*args, **kwargs)


class OfficialStream:
    """`Token2wav.stream(tokens, last_chunk=...)` per call, after `set_stream_cache` on the prompt:
    `prompt_tokens` [1, P], `prompt_mel` [1, 2 P, 80], `speaker` [1, 192] (the raw embedding the
    front end would give). Each call returns the waveform Token2wav returns ([1, samples] float32)."""

    def __init__(self, flow, hift, prompt_tokens, prompt_mel, speaker, steps: int, hift_noise):
        Token2wav = token2wav_class()
        self.module = sys.modules[Token2wav.__module__]
        t2w = Token2wav.__new__(Token2wav)
        t2w.float16, t2w.n_timesteps, t2w.flow = False, steps, flow
        layers = stepaudio2_modules().hifigan_layers

        def official_hift(mel, cache_source):
            noise = hift_noise(mel.shape[2] * 480)
            return hift_reference(hift, layers, mel, noise, cache_source, torch.tensor([1.0 if cache_source.shape[2] else 0.0]))

        t2w.hift = official_hift
        # the stream constants `Token2wav.__init__` sets (on the CPU)
        t2w.mel_cache_len = CACHE_FRAMES
        t2w.source_cache_len = int(t2w.mel_cache_len * 480)
        t2w.speech_window = torch.from_numpy(np.hamming(2 * t2w.source_cache_len))
        lens = torch.tensor([prompt_tokens.shape[1]], dtype=torch.int32)
        t2w._prepare_prompt = lambda _wav: (prompt_tokens, lens, speaker, prompt_mel,
                                            torch.tensor([prompt_mel.shape[1]], dtype=torch.int32))
        self.t2w = t2w
        with self._on_cpu():
            t2w.stream_cache, t2w.hift_cache_dict = t2w.set_stream_cache(None)

    @contextlib.contextmanager
    def _on_cpu(self):
        real = self.module.torch
        self.module.torch = _OnCpu(real)
        try:
            with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
                warnings.simplefilter("ignore")  # autocast("cuda") without CUDA disables itself
                yield
        finally:
            self.module.torch = real

    def __call__(self, tokens, last_chunk: bool) -> torch.Tensor:
        with self._on_cpu():
            wav = self.t2w.stream([int(t) for t in tokens], None, last_chunk=last_chunk, return_waveform=True)
        return torch.from_numpy(np.asarray(wav, dtype=np.float32))
