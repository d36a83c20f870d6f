"""Recipe `minicpm-o`: MiniCPM-o 4.5's speech output, TTS head + Token2wav vocoder.

The components and their roles are declared in `facts.py` (read without importing this module).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import torch
from torch.nn import functional as F

from ...component import LOGITS, SIGNAL, Component
from ...errors import EdgexError
from .. import RECIPES
from ..base import LoadedModel, Recipe, build_component, spread_calibration
from . import encoder, flow, hift, tts
from .facts import FACTS, ROLES
from .gguf import DECODE_FEED, PREFILL_FEED, head_layout
from .models import build_from_preset
from .pipeline import EncoderStream, HeadUtterance, VocoderUtterance
from .presets import get_preset
from .stepaudio2_import import stepaudio2_modules

# (prefill chunk, KV slots) of the head graphs per preset; checkpoints get the real sizes.
_HEAD_SIZES = {"tiny": (16, 64)}
_REAL_HEAD_SIZES = (64, 512)
LAST_FIXED_STEP = 11  # the tts_decode's fixed samples: steps 0, 3 and 11
DEFAULT_STEPS, DEFAULT_FRAMES = 10, 50
DEFAULT_MAX_PROMPT = 150  # the longest voice prompt the streaming graphs take, in 25 Hz tokens (6 s)
STREAM_CHUNKS = 4  # calls per streaming sample utterance


# Parity runs the reference on every sample itself (the outputs computed to declare the specs are not kept).
_component = partial(build_component, FACTS, keep_reference_outputs=False)


def _draw(make, per_utterance: int):
    """Calibration sets spread evenly over the positions of the calibration utterances."""
    return spread_calibration(make, per_utterance, ends=False)


@RECIPES.register(FACTS.name)
class MiniCPMORecipe(Recipe):
    facts = FACTS

    def load(self, preset: str | None, checkpoint: Path | None, seed: int, options: dict | None = None) -> LoadedModel:
        options = dict(options or {})
        if checkpoint is not None:
            from .checkpoint import load_checkpoint

            models, sizes = load_checkpoint(Path(checkpoint), seed), _REAL_HEAD_SIZES
        else:
            name = preset or self.default_preset
            models, sizes = build_from_preset(get_preset(name), seed), _HEAD_SIZES.get(name, _REAL_HEAD_SIZES)
        slots = options.get("max_context", sizes[1])
        if slots < sizes[0] + LAST_FIXED_STEP + 1:
            raise EdgexError(f"--set max_context={slots}: at least {sizes[0] + LAST_FIXED_STEP + 1} (the {sizes[0]}-row "
                             f"prompt and the {LAST_FIXED_STEP + 1} decode steps the tts_decode samples reach)")
        built = {"prefill_len": sizes[0], "max_context": slots, "seed": seed,
                 "steps": options.get("steps", DEFAULT_STEPS), "frames": options.get("frames", DEFAULT_FRAMES),
                 "max_prompt": options.get("max_prompt", DEFAULT_MAX_PROMPT)}
        return LoadedModel(self.name, models, models.source, built)

    def components(self, loaded: LoadedModel, names: list[str] | None = None) -> list[Component]:
        names = list(ROLES) if not names else names
        for n in names:
            if n not in ROLES:
                raise EdgexError(f"no such component {n!r} in minicpm-o (known: {', '.join(ROLES)})")
        builder = _ComponentBuilder(loaded)
        return [getattr(builder, n)() for n in names]


class _ComponentBuilder:
    """Samples from two eager utterances, A (export example) and B (held out); calibration from
    further seeds, never a sample's inputs."""

    def __init__(self, loaded: LoadedModel):
        self.models = loaded.models
        self.options = loaded.options
        seed = loaded.options["seed"]
        self._seeds = {"a": seed, "b": seed + 1}
        self._calibration_seed = seed + 1000
        self._heads: dict[str, HeadUtterance] = {}
        self._vocoder: dict[str, VocoderUtterance] = {}
        self._streams: dict[str, EncoderStream] = {}

    def _seed(self, which: str) -> int:
        return self._seeds.get(which, self._calibration_seed + int(which.removeprefix("cal")) if which.startswith("cal") else 0)

    def head_utt(self, which: str) -> HeadUtterance:
        if which not in self._heads:
            o = self.options
            self._heads[which] = HeadUtterance(self.models.tts, o["prefill_len"], o["max_context"], self._seed(which))
        return self._heads[which]

    def voc_utt(self, which: str) -> VocoderUtterance:
        if which not in self._vocoder:
            o = self.options
            self._vocoder[which] = VocoderUtterance(self.models.flow, o["frames"], o["steps"], self._seed(which),
                                                    official_noise=which == "a")
        return self._vocoder[which]

    @property
    def encoder_slots(self) -> int:
        """25 Hz encoder cache rows the streaming graphs hold: the longest prompt + 50 (Token2wav
        keeps the prompt + 100 frames at 50 Hz after each call); a shorter prompt is masked."""
        return self.options["max_prompt"] + 50

    def _stream_shape(self, which: str) -> tuple[int, int, int]:
        """(prompt tokens, calls, tokens of the last call) of a sample utterance: the longest prompt
        with an 18-token flush (a), a short prompt ending on a 25-token call (b), a 2-call utterance
        flushing 1 token (c); calibration utterances over prompts up to the longest."""
        longest = self.options["max_prompt"]
        shapes = {"a": (longest, STREAM_CHUNKS, 18), "b": (max(1, longest // 4), STREAM_CHUNKS, encoder.CHUNK),
                  "c": (max(1, longest // 2), 2, 1)}
        if which in shapes:
            return shapes[which]
        return max(1, longest * (self._seed(which) % 4 + 1) // 4), STREAM_CHUNKS, encoder.CHUNK

    # The streaming samples: (utterance, call) of each regular call, and the utterance of each last call.
    _CALL_SAMPLES = {"utterance_a_chunk0": ("a", 0), "utterance_b_chunk3_trimmed_last": ("b", 3), "utterance_b_chunk1": ("b", 1)}
    _LAST_SAMPLES = {"utterance_a_last18": "a", "utterance_b_last25": "b", "utterance_c_last1": "c"}

    def stream(self, which: str) -> EncoderStream:
        if which not in self._streams:
            prompt, calls, last = self._stream_shape(which)
            keep = None  # a calibration utterance (`cal<u>`): every call
            if not which.startswith("cal"):
                keep = {k for u, k in self._CALL_SAMPLES.values() if u == which}
                if which in self._LAST_SAMPLES.values():
                    keep.add(-1)
            self._streams[which] = EncoderStream(self.models.flow, prompt, calls, self.encoder_slots,
                                                 self.options["steps"], self._seed(which), last, keep)
        return self._streams[which]

    def _call_samples(self, key: str) -> dict:
        return {name: self.stream(u).chunks[k][key] for name, (u, k) in self._CALL_SAMPLES.items()}

    def _last_samples(self, key: str) -> dict:
        return {name: self.stream(u).chunks[-1][key] for name, u in self._LAST_SAMPLES.items()}

    # -- TTS head ---------------------------------------------------------------------------
    def tts_prefill(self) -> Component:
        head = self.models.tts
        return _component(
            "tts_prefill", tts.TTSPrefill(head, self.options["prefill_len"]), ["inputs_embeds"],
            [("logits", LOGITS), ("key", SIGNAL), ("value", SIGNAL)],
            partial(tts.prefill_reference, head),
            {"utterance_a": (self.head_utt("a").prefill_embeds,), "utterance_b": (self.head_utt("b").prefill_embeds,)},
            _draw(lambda u, _k: (self.head_utt(u).prefill_embeds,), 1),
            layouts={"gguf": head_layout(head, PREFILL_FEED)},
            metadata={"prefill_len": self.options["prefill_len"]},
        )

    def _decode_sample(self, which: str, step: int, stale_from: str | None = None) -> tuple:
        """A tts_decode call: the cache zero-padded as a runner holds it, or with the slots the call
        ignores (position onwards) holding another utterance's entries, as a runner that does not
        clear its cache between utterances leaves them."""
        embeds, position, key, value = self.head_utt(which).step(step)
        if stale_from is not None:
            stale = self.head_utt(stale_from)
            stale.step(stale.last_step)
            pos = int(position[0])
            key, value = key.clone(), value.clone()
            key[:, :, :, pos:], value[:, :, :, pos:] = stale.key[:, :, :, pos:], stale.value[:, :, :, pos:]
        return embeds, position, key, value

    def _decode_samples(self) -> dict:
        """Steps 0, 3 and 11; a step half-way through the cache, its ignored slots stale; the last
        slot (a call at position max_context - 1: the most RoPE rotation and the longest attention
        the graph computes)."""
        last = self.head_utt("b").last_step
        middle = max(LAST_FIXED_STEP + 1, last // 2)
        return {"utterance_a_step3": self._decode_sample("a", 3), "utterance_b_step11": self._decode_sample("b", LAST_FIXED_STEP),
                "utterance_b_step0": self._decode_sample("b", 0),
                f"utterance_a_step{middle}_stale_slots": self._decode_sample("a", middle, stale_from="b"),
                f"utterance_b_step{last}_last_slot": self._decode_sample("b", last)}

    def tts_decode(self) -> Component:
        head = self.models.tts
        per_utterance = 11  # calibration steps per utterance, spread over every position up to the last slot

        def calibration_step(u: str, k: int) -> tuple:
            return self._decode_sample(u, k * self.head_utt(u).last_step // (per_utterance - 1))

        return _component(
            "tts_decode", tts.TTSDecode(head, self.options["max_context"]), ["inputs_embeds", "position", "past_key", "past_value"],
            [("logits", LOGITS), ("key", SIGNAL), ("value", SIGNAL)],
            partial(tts.decode_reference, head),
            self._decode_samples(),
            _draw(calibration_step, per_utterance),
            # 32 sets over 3 calibration utterances: the QDQ w8a16 graph scored 8.3-16.3 dB with 8
            # (activation ranges of a few positions), 27.7-35.4 dB with 32 (tiny, ONNX Runtime CPU)
            calibration_size=32,
            layouts={"gguf": head_layout(head, DECODE_FEED)},
            metadata={"max_context": self.options["max_context"]},
        )

    # -- Token2wav streaming token encoder ----------------------------------------------------
    def flow_encoder(self) -> Component:
        flow_model = self.models.flow
        return _component(
            "flow_encoder", encoder.FlowEncoder(flow_model, self.encoder_slots),
            ["tokens", "att_cache1", "att_cache2", "cnn_cache", "cache_len", "last_chunk"],
            [("mu", SIGNAL), ("new_att1", SIGNAL), ("new_att2", SIGNAL), ("new_cnn_cache", SIGNAL)],
            partial(encoder.encoder_reference, flow_model),
            self._call_samples("inputs"),
            _draw(lambda u, k: self.stream(u).chunks[k]["inputs"], STREAM_CHUNKS),
            calibration_size=STREAM_CHUNKS, metadata={"slots": self.encoder_slots, "max_prompt": self.options["max_prompt"]},
            tables={"input_embedding": flow_model.input_embedding.weight},  # a chunk reads 28 of its rows
        )

    def flow_encoder_last(self) -> Component:
        flow_model = self.models.flow
        return _component(
            "flow_encoder_last", encoder.FlowEncoderLast(flow_model, self.encoder_slots),
            ["tokens", "att_cache1", "att_cache2", "cnn_cache", "cache_len", "length"],
            [("mu", SIGNAL), ("new_att1", SIGNAL), ("new_att2", SIGNAL), ("new_cnn_cache", SIGNAL)],
            partial(encoder.encoder_last_reference, flow_model),
            self._last_samples("last_inputs"),
            _draw(lambda u, _k: self.stream(u).chunks[-1]["last_inputs"], 1),
            metadata={"slots": self.encoder_slots, "max_prompt": self.options["max_prompt"],
                      "max_tokens": encoder.CHUNK + encoder.LOOKAHEAD},
            tables={"input_embedding": flow_model.input_embedding.weight},
        )

    def flow_chunk_last(self) -> Component:
        cfm, steps = self.models.flow.decoder, self.options["steps"]
        slots = int(self.models.flow.up_rate) * self.encoder_slots
        return _component(
            "flow_chunk_last", flow.FlowChunkLast(cfm, steps, slots),
            ["noise", "mu", "spks", "att_cache", "cnn_cache", "cache_len", "frames"],
            [("mel", SIGNAL), ("new_att", SIGNAL), ("new_cnn_cache", SIGNAL)],
            partial(flow.chunk_last_reference, cfm, steps),
            self._last_samples("last_flow_inputs"),
            _draw(lambda u, _k: self.stream(u).chunks[-1]["last_flow_inputs"], 1),
            metadata={"steps": steps, "slots": slots},
        )

    def flow_chunk(self) -> Component:
        cfm, steps = self.models.flow.decoder, self.options["steps"]
        slots = int(self.models.flow.up_rate) * self.encoder_slots
        return _component(
            "flow_chunk", flow.FlowChunk(cfm, steps, slots),
            ["noise", "mu", "spks", "att_cache", "cnn_cache", "cache_len"],
            [("mel", SIGNAL), ("new_att", SIGNAL), ("new_cnn_cache", SIGNAL)],
            partial(flow.chunk_reference, cfm, steps),
            self._call_samples("flow_inputs"),
            _draw(lambda u, k: self.stream(u).chunks[k]["flow_inputs"], STREAM_CHUNKS),
            calibration_size=STREAM_CHUNKS, metadata={"steps": steps, "slots": slots},
        )

    # -- Token2wav flow matching ------------------------------------------------------------
    def flow_step(self) -> Component:
        cfm, steps = self.models.flow.decoder, self.options["steps"]
        return _component(
            "flow_step", flow.FlowStep(cfm), ["x", "mu", "spks", "cond", "t", "dt"], [("x_next", SIGNAL)],
            partial(flow.step_reference, cfm),
            {"utterance_a_step0": self.voc_utt("a").states[0], "utterance_b_step4": self.voc_utt("b").states[4 % steps],
             "utterance_b_last": self.voc_utt("b").states[-1]},
            _draw(lambda u, k: self.voc_utt(u).states[k], steps),
            calibration_size=steps,
            metadata={"frames": self.options["frames"]},
        )

    def flow(self) -> Component:
        cfm, steps = self.models.flow.decoder, self.options["steps"]

        def sample(which: str):
            u = self.voc_utt(which)
            return u.noise, u.mu, u.spks, u.cond

        return _component(
            "flow", flow.Flow(cfm, steps), ["noise", "mu", "spks", "cond"], [("mel", SIGNAL)],
            partial(flow.flow_reference, cfm, steps),
            {"utterance_a_official_noise": sample("a"), "utterance_b": sample("b")},
            _draw(lambda u, _k: sample(u), 1),
            metadata={"steps": steps, "frames": self.options["frames"]},
        )

    # -- HiFT ------------------------------------------------------------------------------
    @torch.no_grad()
    def _hift_sample(self, which: str, cached: bool):
        """The utterance's mel with seeded source noise; `cached`: the streaming state of a chunk
        that follows another (the source tail of utterance `which` run before it)."""
        mel = self.voc_utt(which).mel
        gen = torch.Generator().manual_seed(self._seed(which) + 77)
        samples = mel.shape[2] * hift.HiFT(self.models.hift, 1).upsample
        noise = torch.randn(1, samples, hift.HARMONICS, generator=gen)
        cache = torch.zeros(1, 1, hift.CACHE_FRAMES * samples // mel.shape[2])
        if cached:
            layers = stepaudio2_modules().hifigan_layers
            _, source = hift.hift_reference(self.models.hift, layers, mel.flip(2), noise.flip(1), cache, torch.zeros(1))
            cache = source[:, :, -cache.shape[2]:].clone()
        return mel, noise, cache, torch.tensor([1.0 if cached else 0.0])

    @torch.no_grad()
    def _hift_stream_sample(self, which: str, frames: int, cached: bool):
        """A call of `frames` real frames in the `hift_stream` layout: the utterance's mel (behind 8
        frames of its reversed mel when `cached`, the state `_hift_sample` builds), zero-padded."""
        mel, noise, cache, use = self._hift_sample(which, cached)
        width = self.hift_stream_frames
        real = mel[..., :frames] if not cached else torch.cat((mel.flip(2)[..., :hift.CACHE_FRAMES], mel), dim=2)[..., :frames]
        gen = torch.Generator().manual_seed(self._seed(which) + 78)
        noise = torch.randn(1, width * noise.shape[1] // mel.shape[2], hift.HARMONICS, generator=gen)
        return F.pad(real, (0, width - real.shape[2])), noise, cache, use, torch.tensor([real.shape[2]])

    @property
    def hift_stream_frames(self) -> int:
        """8 cached frames + the 2 x 28 a last call of 28 tokens brings: every call of a stream fits."""
        return hift.CACHE_FRAMES + int(self.models.flow.up_rate) * (encoder.CHUNK + encoder.LOOKAHEAD)

    def hift_stream(self) -> Component:
        layers = stepaudio2_modules().hifigan_layers
        width = self.hift_stream_frames
        up = int(self.models.flow.up_rate)
        calls = [(50, False), (hift.CACHE_FRAMES + up * 18, True), (hift.CACHE_FRAMES + 50, True), (up * 1, False)]
        return _component(
            "hift_stream", hift.HiFTStream(self.models.hift, width), ["mel", "noise", "cache_source", "use_cache", "frames"],
            [("wav", SIGNAL), ("source", SIGNAL)],
            partial(hift.hift_stream_reference, self.models.hift, layers),
            {"utterance_a_first_call": self._hift_stream_sample("a", 50, False),
             "utterance_b_cached_flush18": self._hift_stream_sample("b", hift.CACHE_FRAMES + up * 18, True),
             "utterance_b_cached_regular": self._hift_stream_sample("b", hift.CACHE_FRAMES + 50, True),
             "utterance_a_flush1_alone": self._hift_stream_sample("a", up, False)},
            _draw(lambda u, k: self._hift_stream_sample(u, *calls[k]), len(calls)),
            metadata={"frames": width},
        )

    def hift(self) -> Component:
        layers = stepaudio2_modules().hifigan_layers
        frames = self.options["frames"]
        return _component(
            "hift", hift.HiFT(self.models.hift, frames), ["mel", "noise", "cache_source", "use_cache"],
            [("wav", SIGNAL), ("source", SIGNAL)],
            partial(hift.hift_reference, self.models.hift, layers),
            {"utterance_a_first_chunk": self._hift_sample("a", False), "utterance_b_cached": self._hift_sample("b", True)},
            _draw(lambda u, k: self._hift_sample(u, k == 1), 2),
            metadata={"frames": frames},
        )


__all__ = ["MiniCPMORecipe"]
