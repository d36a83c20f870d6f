"""Recipe `qwen3-tts`: Qwen3-TTS (12 Hz tokenizer) split into talker, code predictor and Code2Wav.

The components and their roles are declared in `facts.py` (read without importing this module).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Iterator

import torch
from transformers.cache_utils import DynamicCache

from ...component import LOGITS, SIGNAL, TOKENS, Component
from ...errors import EdgexError
from .. import RECIPES
from ..base import LoadedModel, Recipe, build_component, spread_calibration
from .facts import FACTS, ROLES
from . import code2wav, predictor, talker, voice
from . import in_situ as situ
from .gguf import DECODE_FEED, PREFILL_FEED, talker_layout
from .gguf_mmproj import mmproj_layouts
from .models import build_from_preset, load_checkpoint
from .pipeline import AUDIO_CODES, Utterance, padded_cache
from .presets import get_preset

# Graph sizes per preset family: (prefill chunk, talker KV slots).
_SIZES = {"tiny": (16, 64)}
_REAL_SIZES = (32, 256)
WINDOW_CONTEXT, WINDOW_NEW = 72, 25  # code2wav window (frames)
STREAM_CHUNK = 25  # frames per code2latent / latent2wav call
PREDICTOR_SLOTS = 15  # past positions a predictor step can see (16 per frame, last never cached)
PREDICTOR_STEPS = PREDICTOR_SLOTS + 1  # step graph calls per frame (codebook 0 position, then 15 codebooks)
UTTERANCE_FRAMES = WINDOW_CONTEXT + WINDOW_NEW + 3
REFERENCE_FRAMES = 40  # 80 ms frames of reference audio the voice-prompt graphs take unless told
LAST_SAMPLED_FRAME = 30  # the talker decode's fixed samples: frames 10 and 30


# The reference's outputs on a component's first sample, computed to declare its output specs, serve
# parity too.
_component = partial(build_component, FACTS, keep_reference_outputs=True)


def _calibration(make, per_utterance: int):
    """Calibration sets spread over every position of the calibration utterances, the first and
    the last always among them (early positions only: 1.1 dB on the predictor's step-15 key, 5.8 dB
    on a 6-set talker_decode that missed its last slots)."""
    return spread_calibration(make, per_utterance, ends=True)


@RECIPES.register(FACTS.name)
class Qwen3TTSRecipe(Recipe):
    facts = FACTS
    in_situ_components = situ.COMPONENTS
    in_situ_optional = situ.VOICE

    def in_situ(self, loaded, stages, settings, progress) -> dict:
        return situ.in_situ(loaded, stages, settings, progress)

    def load(self, preset: str | None, checkpoint: Path | None, seed: int, options: dict | None = None) -> LoadedModel:
        if checkpoint is not None:
            models = load_checkpoint(checkpoint)
            sizes = _REAL_SIZES
        else:
            name = preset or self.default_preset
            models = build_from_preset(get_preset(name), seed)
            sizes = _SIZES.get(name, _REAL_SIZES)
        slots = (options or {}).get("max_context", sizes[1])
        if slots <= sizes[0] + LAST_SAMPLED_FRAME:
            raise EdgexError(f"--set max_context={slots}: at least {sizes[0] + LAST_SAMPLED_FRAME + 1} (the {sizes[0]}-position "
                             f"prompt and the {LAST_SAMPLED_FRAME + 1} frames the talker decode samples reach)")
        reference = (options or {}).get("reference_frames", REFERENCE_FRAMES)
        if reference > UTTERANCE_FRAMES:
            raise EdgexError(f"--set reference_frames={reference}: at most {UTTERANCE_FRAMES} (the eager utterances the "
                             "voice-prompt samples are decoded from)")
        return LoadedModel(self.name, models, models.source, {"prefill_len": sizes[0], "max_context": slots, "seed": seed,
                                                              "reference_frames": reference})

    def components(self, loaded: LoadedModel, names: list[str] | None = None) -> list[Component]:
        return list(self.iter_components(loaded, names))

    def iter_components(self, loaded: LoadedModel, names: list[str] | None = None) -> Iterator[Component]:
        """Each component when asked for, the eager utterances generated as the first needs them:
        the prompt-only talker prefill is ready in seconds, the decode's samples take minutes."""
        names = self.facts.default_components() if not names else names
        for n in names:
            if n not in ROLES:
                raise EdgexError(f"no such component {n!r} in qwen3-tts (known: {', '.join(ROLES)})")
        builder = _ComponentBuilder(loaded)
        return (getattr(builder, n)() for n in names)


class _ComponentBuilder:
    """Builds each component with samples from two eager utterances: A (example) and B (held out).

    Calibration draws from further utterances `cal0`, `cal1`, ... generated with their own seeds,
    so quantizers never see the inputs parity scores."""

    def __init__(self, loaded: LoadedModel):
        self.talker = loaded.models.talker
        self.decoder = loaded.models.decoder
        self.models = loaded.models
        self.reference_frames = loaded.options.get("reference_frames", REFERENCE_FRAMES)
        self.checkpoint = loaded.source.get("checkpoint")  # its tokenizer goes into the GGUF
        self.prefill_len = loaded.options["prefill_len"]
        self.slots = loaded.options["max_context"]
        seed = loaded.options["seed"]
        self._seeds = {"a": seed, "b": seed + 1}
        self._calibration_seed = seed + 1000
        self._utts: dict[str, Utterance] = {}

    def utt(self, which: str) -> Utterance:
        if which not in self._utts:
            seed = self._seeds.get(which)
            if seed is None:  # "cal<i>"
                seed = self._calibration_seed + int(which.removeprefix("cal"))
            self._utts[which] = Utterance.kept(self.talker, self.prefill_len, UTTERANCE_FRAMES, seed,
                                          horizon=self.slots - self.prefill_len)
        return self._utts[which]

    # -- talker -----------------------------------------------------------------------------
    def talker_prefill(self) -> Component:
        return _component(
            "talker_prefill",
            talker.TalkerPrefill(self.talker, self.prefill_len),
            ["inputs_embeds"],
            [("logits", LOGITS), ("hidden", SIGNAL), ("key", SIGNAL), ("value", SIGNAL)],
            partial(talker.prefill_reference, self.talker),
            {"utterance_a": (self.utt("a").prefill_embeds,), "utterance_b": (self.utt("b").prefill_embeds,)},
            _calibration(lambda u, _k: (self.utt(u).prefill_embeds,), 1),
            layouts={"gguf": talker_layout(self.talker, PREFILL_FEED, self.checkpoint)},
            metadata={"prefill_len": self.prefill_len},
        )

    def _decode_sample(self, which: str, frame: int, stale_from: str | None = None):
        """The talker decode call of a frame: its cache zero-padded as the runners hold it, or with
        the slots the call ignores (position onwards) holding another utterance's entries there,
        as a runner that does not clear its cache between utterances leaves them."""
        utt = self.utt(which)
        rec = utt.frame(frame)
        pos = rec["position"]
        if pos >= self.slots:
            raise EdgexError(f"talker sample position {pos} exceeds max_context {self.slots}")
        key, value = (padded_cache(t, self.slots) for t in utt.cache(pos))
        if stale_from is not None:
            stale_key, stale_value = self.utt(stale_from).cache(self.slots)
            key[:, :, :, pos:], value[:, :, :, pos:] = stale_key[:, :, :, pos:], stale_value[:, :, :, pos:]
        return rec["next_embeds"], torch.tensor([pos]), key, value

    def _decode_samples(self) -> dict:
        """Frames 10 and 30; the default in-situ run's last decode call, its ignored slots stale;
        the last slot (a call at position max_context - 1: the most RoPE rotation and the
        longest attention the graph computes)."""
        in_situ_last = situ.default_frames(self.slots, self.prefill_len) - 1
        last = self.slots - 1 - self.prefill_len
        return {"utterance_a_frame10": self._decode_sample("a", 10), "utterance_b_frame30": self._decode_sample("b", LAST_SAMPLED_FRAME),
                f"utterance_a_frame{in_situ_last}_stale_slots": self._decode_sample("a", in_situ_last, stale_from="b"),
                f"utterance_b_frame{last}_last_slot": self._decode_sample("b", last)}

    def talker_decode(self) -> Component:
        return _component(
            "talker_decode",
            talker.TalkerDecode(self.talker, self.slots),
            ["inputs_embeds", "position", "past_key", "past_value"],
            [("logits", LOGITS), ("hidden", SIGNAL), ("key", SIGNAL), ("value", SIGNAL)],
            partial(talker.decode_reference, self.talker),
            self._decode_samples(),
            # every position up to the last slot: a static quantizer's ranges are those of the positions
            # calibration sees, and a later position's activations beyond them would saturate
            _calibration(lambda u, k: self._decode_sample(u, 4 + k * (self.slots - self.prefill_len - 5) // 7), 8),
            layouts={"gguf": talker_layout(self.talker, DECODE_FEED, self.checkpoint)},
            metadata={"max_context": self.slots},
        )

    # -- code predictor ---------------------------------------------------------------------
    def _frame_sample(self, which: str, frame: int, sampled: bool):
        rec = self.utt(which).frame(frame)
        noise = rec["noise"] if sampled else torch.zeros_like(rec["noise"])
        return rec["talker_hidden"], rec["code0"], noise

    def code_predictor(self) -> Component:
        return _component(
            "code_predictor",
            predictor.CodePredictorFrame(self.talker),
            ["talker_hidden", "code0", "noise"],
            [("codes", TOKENS, ("logits", "noise")), ("logits", LOGITS), ("codec_embeds", SIGNAL)],
            partial(predictor.frame_reference, self.talker),
            {
                "utterance_a_frame10_greedy": self._frame_sample("a", 10, False),
                "utterance_b_frame30_sampled": self._frame_sample("b", 30, True),
                "utterance_b_frame31_greedy": self._frame_sample("b", 31, False),
            },
            _calibration(lambda u, k: self._frame_sample(u, 4 + 12 * k, k % 2 == 0), 8),
            forced_reference=lambda inputs, forced: predictor.frame_reference(self.talker, *inputs, forced_codes=forced["codes"]),
            tables=self._predictor_tables(),
            layouts=mmproj_layouts(self.models, "code_predictor"),
        )

    def _predictor_tables(self) -> dict[str, torch.Tensor]:
        """The code embedding tables a predictor frame gathers from: the talker's (code 0) and the
        predictor's 15, as the eager model holds them."""
        tables = {"talker.codec_embedding": self.talker.model.codec_embedding.weight}
        for g, table in enumerate(self.talker.code_predictor.model.codec_embedding):
            tables[f"code_predictor.codec_embedding.{g}"] = table.weight
        return tables

    @torch.no_grad()
    def _step_sample(self, which: str, frame: int, step: int):
        """Predictor state at `step` of a recorded frame, teacher-forced with the frame's codes."""
        rec = self.utt(which).frame(frame)
        pred = self.talker.code_predictor
        all_codes = torch.cat((rec["code0"], rec["codes"]), dim=1)
        embeds = [rec["talker_hidden"], self.talker.model.codec_embedding(rec["code0"])]
        embeds += [pred.model.codec_embedding[g](all_codes[:, g + 1 : g + 2]) for g in range(predictor.GROUPS - 1)]
        layers = len(pred.model.layers)
        key = torch.zeros(layers, 1, pred.config.num_key_value_heads, PREDICTOR_SLOTS, pred.config.head_dim)
        value = torch.zeros_like(key)
        if step > 0:
            cache = DynamicCache()
            pred.model(inputs_embeds=pred.small_to_mtp_projection(torch.cat(embeds[:step], dim=1)),
                       past_key_values=cache, use_cache=True)
            for i in range(layers):
                key[i, :, :, :step] = cache[i][0]
                value[i, :, :, :step] = cache[i][1]
        code = all_codes[:, max(step - 1, 0) : max(step - 1, 0) + 1]
        return rec["talker_hidden"], code, torch.tensor([step]), key, value

    def code_predictor_step(self) -> Component:
        return _component(
            "code_predictor_step",
            predictor.CodePredictorStep(self.talker),
            ["talker_hidden", "code", "step", "past_key", "past_value"],
            [("logits", LOGITS), ("key", SIGNAL), ("value", SIGNAL)],
            partial(predictor.step_reference, self.talker),
            {
                "utterance_a_frame10_step5": self._step_sample("a", 10, 5),
                "utterance_b_frame30_step0": self._step_sample("b", 30, 0),
                "utterance_b_frame30_step1": self._step_sample("b", 30, 1),
                "utterance_b_frame30_step15": self._step_sample("b", 30, 15),
            },
            _calibration(lambda u, k: self._step_sample(u, 20, k), PREDICTOR_STEPS),
            calibration_size=PREDICTOR_STEPS,  # one set per codebook step: 8 covered only the even ones (step 15: 5.9 dB)
            tables={"stacked_codec_embedding": self._step_table(), "stacked_heads": self._step_heads()},
        )

    def _step_table(self) -> torch.Tensor:
        """The one table a predictor step gathers from: step s >= 1 embeds code s-1 with the talker's
        table (s = 1, its first `vocab` rows) or the predictor's table s-2, stacked in step order."""
        vocab = self.talker.code_predictor.lm_head[0].weight.shape[0]
        tables = [self.talker.model.codec_embedding.weight[:vocab]]
        tables += [t.weight for t in self.talker.code_predictor.model.codec_embedding[: predictor.GROUPS - 1]]
        return torch.cat(tables)

    def _step_heads(self) -> torch.Tensor:
        """The output heads a predictor step picks one of per call (head s-1 at step s), stacked in
        step order, as rows: the samples read 3 of the 15, so the others are read back instead."""
        heads = self.talker.code_predictor.lm_head
        return torch.cat([h.weight for h in heads])

    # -- Code2Wav ---------------------------------------------------------------------------
    def code2wav(self) -> Component:
        frames = WINDOW_CONTEXT + WINDOW_NEW
        return _component(
            "code2wav",
            code2wav.Code2WavWindow(self.decoder, WINDOW_NEW, frames),
            ["codes"],
            [("wav", SIGNAL)],
            partial(code2wav.window_reference, self.decoder, new_frames=WINDOW_NEW),
            {
                "utterance_a_frames0_97": (self.utt("a").codes[..., :frames],),
                "utterance_b_frames3_100": (self.utt("b").codes[..., 3 : 3 + frames],),
            },
            _calibration(lambda u, k: (self.utt(u).codes[..., k : k + frames],), UTTERANCE_FRAMES - frames + 1),
            tables=self._codebook_tables(),
            layouts=mmproj_layouts(self.models, "code2wav", new_frames=WINDOW_NEW),
            metadata={"context_frames": WINDOW_CONTEXT, "new_frames": WINDOW_NEW},
        )

    @torch.no_grad()
    def _codebook_tables(self) -> dict[str, torch.Tensor]:
        """The RVQ codebooks the decoder graphs gather code rows from, each as the official
        codebook's own `decode` gives every entry (its running sum over its usage)."""
        quantizer, tables = self.decoder.quantizer, {}
        for group in ("rvq_first", "rvq_rest"):
            for k, vq in enumerate(getattr(quantizer, group).vq.layers):
                book = vq._codebook
                tables[f"quantizer.{group}.vq.layers.{k}._codebook"] = book.decode(torch.arange(book.codebook_size))
        return tables

    @torch.no_grad()
    def _latent_sample(self, which: str, chunk: int):
        codes = self.utt(which).codes
        start = chunk * STREAM_CHUNK
        dec = self.decoder
        slots = int(dec.config.sliding_window) - 1
        quantized = dec.quantizer.decode(codes[..., : start + STREAM_CHUNK])
        state = torch.zeros(1, quantized.shape[1], 2)
        take = min(start, 2)
        if take:
            state[..., 2 - take :] = quantized[..., start - take : start]
        layers, heads = dec.config.num_hidden_layers, dec.config.num_key_value_heads
        key = torch.zeros(layers, 1, heads, slots, dec.config.head_dim)
        value = torch.zeros_like(key)
        if start:
            hidden = dec.pre_conv(quantized[..., :start]).transpose(1, 2)
            out = dec.pre_transformer(inputs_embeds=hidden, use_cache=True)
            keep = min(start, slots)
            for i in range(layers):
                key[i, :, :, slots - keep :] = out.past_key_values[i][0][:, :, -keep:]
                value[i, :, :, slots - keep :] = out.past_key_values[i][1][:, :, -keep:]
        return codes[..., start : start + STREAM_CHUNK], torch.tensor([start]), state, key, value

    def code2latent(self) -> Component:
        return _component(
            "code2latent",
            code2wav.Code2Latent(self.decoder),
            ["codes", "start", "conv_state", "past_key", "past_value"],
            [("latent", SIGNAL), ("next_conv_state", SIGNAL), ("key", SIGNAL), ("value", SIGNAL)],
            partial(code2wav.code2latent_reference, self.decoder),
            {
                "utterance_a_chunk3": self._latent_sample("a", 3),
                "utterance_b_chunk0": self._latent_sample("b", 0),
                "utterance_b_chunk2": self._latent_sample("b", 2),
            },
            _calibration(self._latent_sample, UTTERANCE_FRAMES // STREAM_CHUNK),
            written={"key": _last_window_slots, "value": _last_window_slots},
            tables=self._codebook_tables(),
            metadata={"chunk_frames": STREAM_CHUNK},
        )

    @torch.no_grad()
    def _wav_sample(self, which: str, chunk: int, context: int):
        latent = code2wav.offline_latent(self.decoder, self.utt(which).codes)
        start = chunk * STREAM_CHUNK
        valid = min(start, context)
        window = torch.zeros(1, latent.shape[1], context + STREAM_CHUNK)
        window[..., context - valid :] = latent[..., start - valid : start + STREAM_CHUNK]
        return window, torch.tensor([valid])

    def latent2wav(self) -> Component:
        context = code2wav.receptive_field_frames(self.decoder)
        return _component(
            "latent2wav",
            code2wav.Latent2Wav(self.decoder, context),
            ["latent", "context_valid"],
            [("wav", SIGNAL)],
            partial(code2wav.latent2wav_reference, self.decoder, context),
            {
                "utterance_a_chunk2": self._wav_sample("a", 2, context),
                "utterance_b_chunk0": self._wav_sample("b", 0, context),
                "utterance_b_chunk3": self._wav_sample("b", 3, context),
            },
            _calibration(lambda u, k: self._wav_sample(u, k, context), UTTERANCE_FRAMES // STREAM_CHUNK),
            metadata={"context_frames": context, "chunk_frames": STREAM_CHUNK},
        )


    # -- voice prompts ----------------------------------------------------------------------
    @torch.no_grad()
    def _reference_audio(self, which: str) -> torch.Tensor:
        """Reference audio [1, 1, reference_frames x 1920]: the eager decoder's waveform of an eager
        utterance's first frames (speech-like: the sound the model makes, at the encoders' rate)."""
        return self.decoder(self.utt(which).codes[..., : self.reference_frames])

    def _voice_module(self, name: str, attribute: str):
        module = getattr(self.models, attribute)
        if module is None:
            source = self.models.source
            where = f"checkpoint {source['checkpoint']}" if "checkpoint" in source else f"preset {source.get('preset')}"
            raise EdgexError(f"qwen3-tts component {name}: the {where} holds no {attribute.replace('_', ' ')} "
                             f"({'a Base checkpoint has one' if attribute == 'speaker_encoder' else 'its speech_tokenizer holds no encoder weights'})")
        return module

    def speaker_encoder(self) -> Component:
        encoder = self._voice_module("speaker_encoder", "speaker_encoder")
        mels = lambda which: (voice.official_mels(self._reference_audio(which)),)  # noqa: E731
        return _component(
            "speaker_encoder",
            voice.SpeakerEncoder(encoder),
            ["mels"],
            [("speaker_embedding", SIGNAL)],
            partial(voice.speaker_reference, encoder),
            {"utterance_a_reference": mels("a"), "utterance_b_reference": mels("b")},
            _calibration(lambda u, _k: mels(u), 1),
            metadata={"reference_frames": self.reference_frames},
        )

    def speech_encoder(self) -> Component:
        encoder = self._voice_module("speech_encoder", "speech_encoder")
        samples = self.reference_frames * voice.SAMPLES_PER_FRAME
        return _component(
            "speech_encoder",
            voice.SpeechEncoder(encoder, samples),
            ["wav"],
            [("codes", TOKENS), ("latent", SIGNAL)],
            partial(voice.speech_reference, encoder),
            {"utterance_a_reference": (self._reference_audio("a"),), "utterance_b_reference": (self._reference_audio("b"),)},
            _calibration(lambda u, _k: (self._reference_audio(u),), 1),
            metadata={"reference_frames": self.reference_frames},
        )


def _last_window_slots(inputs) -> tuple:
    """code2latent's key/value [L, 1, KV, window - 1, D] are the rolled window: a call writes only
    its chunk's positions, the last `chunk` slots; the others are its past_key/value shifted."""
    chunk = inputs[0].shape[-1]
    return (slice(None),) * 3 + (slice(-chunk, None),)


__all__ = ["Qwen3TTSRecipe", "AUDIO_CODES"]
