"""The official utterance in `edgex pipeline qwen3-tts`: the runner (`runner.py`) over the exported
artifacts against the official `generate()` (`official.py`) on the same request, greedy.

Codes are compared frame by frame until EOS. A first difference passes only as a near-tie of the
official model's own scores there (codebook 0: the processed talker scores on the official history;
codebooks 1-15: the official code predictor's logits), at the in-situ tie level; after it the
utterances differ and are not compared further. The waveform (the artifacts' exact streaming pair
over the runner's codes, the official decode over the official codes) is scored over the frames that
agree, against the decoder's gate.

The request is the checkpoint variant's own: a CustomVoice speaker with a language, a VoiceDesign
instruction, a Base x-vector voice prompt; seeded random text ids (edgex ships no tokenizer).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ...errors import EdgexError
from ...parity.check import tie_margin
from ...patches.torch_ops import multinomial_drawn_by
from ...parity.metrics import cosine, snr_db, spectral_db
from . import official as off
from . import runner as rn
from .facts import FACTS
from .predictor import frame_reference

TEXT_TOKENS = 12  # text ids of the default request
SEED_OFFSET = 700  # the request's draws: apart from the parity samples' and the synthetic utterance's


def config_of(loaded) -> dict:
    """The checkpoint's config.json, or a preset's (its talker with the published CustomVoice tables)."""
    source = loaded.source
    if "checkpoint" in source:
        return json.loads((Path(source["checkpoint"]) / "config.json").read_text())
    return off.preset_config(loaded.models.talker.config.to_dict())


def plain_text_bound(config: dict) -> int:
    """Random text ids are drawn below this: under the chat template's special ids and within the
    talker's text vocabulary."""
    vocab = int(config["talker_config"].get("text_vocab_size", rn.IM_START))
    return min(rn.ChatTokens.from_config(config).first_special, vocab)


def default_request(config: dict, seed: int) -> rn.Request:
    """The variant's own request: CustomVoice speaks as its first speaker in English, VoiceDesign
    follows an instruction, Base clones an x-vector voice prompt; text is streamed."""
    rng = np.random.default_rng(seed + SEED_OFFSET)
    chat = rn.ChatTokens.from_config(config)
    text = rn.chat_ids(rng.integers(0, plain_text_bound(config), TEXT_TOKENS), chat)
    talker = config["talker_config"]
    variant = config.get("tts_model_type") or "custom_voice"
    if variant == "base":
        voice = rn.VoicePrompt(rng.standard_normal(talker["hidden_size"]).astype(np.float32))
        return rn.Request(text, language="english", voice=voice)
    if variant == "voice_design":
        return rn.Request(text, language="english", instruct=rn.instruct_ids(rng.integers(0, plain_text_bound(config), 8), chat))
    speakers = list(talker.get("spk_id") or {})
    return rn.Request(text, language="english", speaker=speakers[0] if speakers else None)


def _shape(stage, name: str) -> tuple:
    return tuple(next(s["shape"] for s in stage.entry["inputs"] if s["name"] == name))


def graphs(stages: dict) -> rn.Graphs:
    """The runner's graphs from the pipeline's stages (a looped step graph counts as the step graph)."""
    predictor = stages["code_predictor"]
    step = getattr(predictor, "step", None)  # in_situ's _StepLoop wraps the step graph's stage
    frame = None if step is not None else predictor
    prefill, decode = stages["talker_prefill"], stages["talker_decode"]
    return rn.Graphs(prefill, decode, _shape(prefill, "inputs_embeds")[1], _shape(decode, "past_key"),
                     code_predictor=frame, code_predictor_step=step,
                     predictor_kv_shape=_shape(step, "past_key") if step is not None else None)


def streaming_decoder(stages: dict) -> rn.StreamingDecoder | rn.WindowedDecoder:
    """The decoder the stages hold: the exact streaming pair, else Code2Wav's windowed graph in its
    entry's window (context and new frames, `metadata`), chunk by chunk as llama.cpp's TTS decodes."""
    if "code2latent" not in stages:
        exporter = stages["code2wav"].entry.get("exporter")
        if exporter != "gguf":  # libmtmd's Code2Wav takes any window length; the other files a fixed one
            raise EdgexError(f"the windowed Code2Wav decode takes shorter windows at the start of an utterance, which only "
                             f"libmtmd's code2wav (gguf) runs; the {exporter} code2wav takes a fixed window: place the "
                             "code2latent + latent2wav pair instead (--placement code2latent=...,latent2wav=...)")
        window = stages["code2wav"].entry["metadata"]
        return rn.WindowedDecoder(stages["code2wav"], window["context_frames"], window["new_frames"])
    c2l, l2w = stages["code2latent"], stages["latent2wav"]
    return rn.StreamingDecoder(c2l, l2w, _shape(c2l, "codes"), _shape(c2l, "conv_state"), _shape(c2l, "past_key"),
                               _shape(l2w, "latent"))


def tables(talker) -> rn.Tables:
    return rn.Tables.from_state({f"talker.{k}": v.detach().numpy() for k, v in talker.state_dict().items()})


def _sequence(codes: np.ndarray, stopped: bool, eos: int) -> list[list[int]]:
    """Each frame's 16 codes, then [EOS] where the utterance stopped."""
    return [list(map(int, f)) for f in codes] + ([[eos]] if stopped else [])


@torch.no_grad()
def _margin(official, vocab, settings, ref_codes, hiddens, frame: int, codebook: int, want: int, got: int) -> tuple[float, float]:
    """The official model's own score margin (its choice minus the runner's) at the first difference,
    and the tie margin of the tie gate's noise on those scores' logits."""
    talker = official.model.talker
    hidden = hiddens[frame].reshape(1, 1, -1)
    if codebook == 0:
        logits = talker.codec_head(hidden).reshape(-1).numpy()
        scores = rn.LogitsProcessor(vocab, settings)(logits, [int(c) for c in ref_codes[:frame, 0]])
        finite = logits[np.isfinite(scores)]
    else:
        code0 = torch.tensor([[int(ref_codes[frame, 0])]])
        logits = frame_reference(talker, hidden, code0, torch.zeros(1, rn.GROUPS - 1, rn.AUDIO_CODES))[1][0, codebook - 1].numpy()
        scores = finite = logits
    return float(scores[want]) - float(scores[got]) if got < scores.size else float("inf"), finite


@torch.no_grad()
def _picks_eos(official, vocab, settings, ref_codes, hidden) -> bool:
    """Whether the official model's last step picked EOS (generate() returns no stop flag: the
    frames before EOS and the frames before max_new_tokens look alike when both are `frames`)."""
    logits = official.model.talker.codec_head(hidden.reshape(1, 1, -1)).reshape(-1).numpy()
    scores = rn.LogitsProcessor(vocab, settings)(logits, [int(c) for c in ref_codes[:, 0]])
    return int(np.argmax(scores)) == vocab.codec_eos


def voice_request(config: dict, seed: int, path) -> rn.Request:
    """The default request of a Base checkpoint with the voice prompt read from `path` (`edgex voice-prompt`)."""
    from ...errors import EdgexError

    if (config.get("tts_model_type") or "custom_voice") != "base":
        raise EdgexError(f"--voice: the checkpoint is a {config.get('tts_model_type') or 'custom_voice'} model; voice prompts clone with Base checkpoints")
    try:
        voice = rn.VoicePrompt.load(path)
    except ValueError as exc:
        raise EdgexError(f"--voice: {exc}") from None
    hidden = config["talker_config"]["hidden_size"]
    if voice.speaker_embedding.size != hidden:
        raise EdgexError(f"--voice {path}: its speaker embedding has {voice.speaker_embedding.size} values, the talker's rows {hidden}")
    return rn.Request(default_request(config, seed).text_ids, language="english", voice=voice)


REQUEST_KEYS = ("text", "text_ids", "language", "speaker", "instruct", "instruct_ids", "voice", "non_streaming")


def request_from(loaded, spec: dict, base: Path | None = None) -> rn.Request:
    """A request from its JSON form (`edgex pipeline --request FILE`, `--text`): `text` (tokenized
    with the checkpoint's tokenizer) or `text_ids`, `language` (default english), `speaker`
    (CustomVoice), `instruct` or `instruct_ids`, `voice` (a voice-prompt .npz, relative to `base`),
    `non_streaming`. Unknown keys and values the checkpoint does not know are one-line errors."""
    from ...errors import EdgexError
    from .voice_prompt import tokenize

    unknown = sorted(set(spec) - set(REQUEST_KEYS))
    if unknown:
        raise EdgexError(f"request: unknown key(s) {', '.join(unknown)} (known: {', '.join(REQUEST_KEYS)})")
    if ("text" in spec) == ("text_ids" in spec):
        raise EdgexError("request: give exactly one of text and text_ids")
    config = config_of(loaded)
    checkpoint = loaded.source.get("checkpoint")

    def ids(key_text: str, key_ids: str):
        if key_ids in spec:
            try:
                return [int(i) for i in spec[key_ids]]
            except (TypeError, ValueError):
                raise EdgexError(f"request: {key_ids} must be a list of integers") from None
        if key_text in spec:
            if checkpoint is None:
                raise EdgexError(f"request: {key_text} needs a checkpoint's tokenizer (a preset has none): give {key_ids}")
            return tokenize(Path(checkpoint), str(spec[key_text]))
        return None

    text, instruct = ids("text", "text_ids"), ids("instruct", "instruct_ids")
    if not text or any(not 0 <= i < config["talker_config"].get("text_vocab_size", 151936) for i in text + (instruct or [])):
        raise EdgexError("request: text ids must be non-empty and within the text vocabulary")
    voice = None
    if spec.get("voice") is not None:
        path = Path(spec["voice"])
        voice = voice_request(config, 0, path if path.is_absolute() or base is None else base / path).voice
    chat = rn.ChatTokens.from_config(config)
    request = rn.Request(rn.chat_ids(text, chat), language=str(spec.get("language", "english")), speaker=spec.get("speaker"),
                         instruct=None if instruct is None else rn.instruct_ids(instruct, chat), voice=voice,
                         non_streaming=bool(spec.get("non_streaming", False)))
    vocab = rn.Vocabulary.from_config(config)
    try:
        rn.codec_prefix(request, vocab)
        if request.speaker and request.speaker.lower() not in vocab.speakers:
            raise ValueError(f"speaker {request.speaker!r} is not in the checkpoint's spk_id (known: {', '.join(vocab.speakers) or 'none'})")
    except ValueError as exc:
        raise EdgexError(f"request: {exc}") from None
    return request


def wav_figures(ref: np.ndarray, out: np.ndarray, name: str) -> dict:
    """The decoder's waveform against the eager one: its SNR (`<name>_db`) and, where the recipe
    declares the decoder's wav spectral (`FACTS.spectral_outputs`), the spectral figure
    (`<name>_spectral_db`), which is then the one gated (`gated_wav_figure`)."""
    figures = {f"{name}_db": snr_db(ref, out)}
    if "wav" in FACTS.spectral_outputs.get("latent2wav", ()):
        figures[f"{name}_spectral_db"] = spectral_db(ref, out)
    return figures


def gated_wav_figure(figures: dict, name: str) -> tuple[float, str]:
    """(the figure the decoder's gate judges, what it is) of `wav_figures`."""
    if f"{name}_spectral_db" in figures:
        return figures[f"{name}_spectral_db"], f"spectral figure (waveform SNR {figures[f'{name}_db']:.1f} dB)"
    return figures[f"{name}_db"], "SNR"


def compare(loaded, stages: dict, frames: int, decoder_gate_db: float, request: rn.Request | None = None, voice=None,
            official_voice: rn.VoicePrompt | None = None) -> dict:
    """The official-utterance block of the pipeline report, with its `failures`: at most `frames`
    frames; a first difference is a tie at the talker's (codebook 0) or the predictor's tie level.
    `voice`: a voice-prompt file the default request clones (Base). `official_voice`: the official
    side's voice prompt where it is made apart from the runner's (`voice_clone`: the official modules
    on the reference audio the runner's prompt came from through the exported encoders)."""
    config = config_of(loaded)
    vocab = rn.Vocabulary.from_config(config)
    seed = int(loaded.options.get("seed", 0))
    request = request or _default(loaded, voice)
    official_request = request if official_voice is None else replace(request, voice=official_voice)
    official = off.wrap(loaded.models.talker, loaded.models.decoder, config)
    settings = rn.Settings(max_new_tokens=frames + 1, do_sample=False, subtalker_dosample=False)
    ref_codes, hiddens = off.official_run(official, official_request, settings)
    ref_stopped = len(ref_codes) < frames or _picks_eos(official, vocab, settings, ref_codes, hiddens[-1])
    utt = rn.Runner(graphs(stages), tables(loaded.models.talker), vocab).generate(request, settings)
    want, got = _sequence(ref_codes, ref_stopped, vocab.codec_eos), _sequence(utt.codes, utt.stopped, vocab.codec_eos)
    difference, agreed = None, min(len(ref_codes), len(utt.codes))
    for f, (a, b) in enumerate(zip(want, got)):
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if k is None and len(a) != len(b):  # one stopped (EOS) where the other made a frame
            k = 0
        if k is None:
            continue
        w, g = a[k], b[k]
        margin, logits = _margin(official, vocab, settings, ref_codes, hiddens, f, k, w, g)
        tie_db = (stages["talker_decode"] if k == 0 else stages["code_predictor"]).tie_db
        allowed = tie_margin(tie_db, logits)
        difference = {"frame": f, "codebook": k, "official": w, "runner": g, "margin": margin, "tie_margin": allowed,
                      "tie_db": tie_db, "tie": bool(margin <= allowed)}
        agreed = f
        break
    if difference is None and len(want) != len(got):  # equal until one ran out of frames
        agreed = min(len(ref_codes), len(utt.codes))
    failures = []
    wav = {"wav_db": None}
    if agreed:
        runner_wav = rn.waveform(streaming_decoder(stages), utt.codes[:agreed], request.voice)
        official_wav = off.official_waveform(official, ref_codes[:agreed], official_request.voice)
        wav = wav_figures(official_wav, runner_wav, "wav")
        figure, what = gated_wav_figure(wav, "wav")
        if not figure >= decoder_gate_db:
            failures.append(f"official utterance: the waveform of the {agreed} agreed frames scores {figure:.1f} dB on its "
                            f"{what}, below the decoder's {decoder_gate_db:.1f} dB gate")
    if difference is not None and not difference["tie"]:
        d = difference
        failures.append(f"official utterance: frame {d['frame']} codebook {d['codebook']}: the runner picked {d['runner']} "
                        f"where the official generate() picked {d['official']}, margin {d['margin']:.4g} > tie margin "
                        f"{d['tie_margin']:.4g}")
    elif difference is None and len(want) != len(got):
        failures.append(f"official utterance: the official generate() made {len(ref_codes)} frames, the runner {len(utt.codes)}")
    return {"variant": official.variant, "text_ids": [int(i) for i in request.text_ids], "language": request.language, "speaker": request.speaker,
            "instruct": request.instruct is not None, "voice_prompt": None if request.voice is None else
            ("in-context" if request.voice.in_context else "x-vector"), "non_streaming": request.non_streaming,
            "codec_prefix": rn.codec_prefix(request, vocab), "prompt_rows": utt.prompt_rows,
            "official_frames": len(ref_codes), "runner_frames": len(utt.codes), "official_stopped": ref_stopped,
            "runner_stopped": utt.stopped, "frames_compared": agreed if difference else min(len(ref_codes), len(utt.codes)),
            "codes_equal": difference is None and len(want) == len(got), "first_difference": difference,
            **wav, "failures": failures}


VOICE_SEED_OFFSET = 800  # the reference audio and transcript of the in-situ voice clone


def reference_audio(loaded, frames: int, seed: int) -> np.ndarray:
    """Reference speech [frames x 1920 samples]: the eager decoder's waveform of seeded codes (the
    sound the model makes, at the encoders' rate and exactly the voice graphs' length)."""
    codes = np.random.default_rng(seed + VOICE_SEED_OFFSET).integers(0, rn.AUDIO_CODES, (1, rn.GROUPS, frames))
    with torch.no_grad():
        return loaded.models.decoder(torch.from_numpy(codes)).reshape(-1).numpy().astype(np.float32)


def voice_clone(loaded, stages: dict, frames: int, decoder_gate_db: float, request: rn.Request | None = None) -> dict:
    """A Base voice cloned in situ: a voice prompt made from reference audio through the exported
    `speaker_encoder` (and `speech_encoder`, where exported: then in-context, with a seeded
    transcript) as a device makes it (`runner.voice_prompt`: its own log-mel, then the graphs), and the
    runner's utterance with it against the official `generate()` with the prompt the official modules
    make from the same audio (`official_voice_prompt`, what `edgex voice-prompt` writes). Scored: the
    speaker embedding against the official one (the speaker encoder's gate), the reference codes
    (every one equal), and the utterance as `compare` scores it. `request`: its text, language and
    streaming mode (default: the default request's), with the cloned voice."""
    from .voice_prompt import official_voice_prompt

    config = config_of(loaded)
    variant = config.get("tts_model_type") or "custom_voice"
    if variant != "base":
        return {"note": f"not run: a {variant} checkpoint clones no voice (its speaker_encoder / speech_encoder "
                        "artifacts are not composed)", "failures": []}
    seed = int(loaded.options.get("seed", 0))
    reference_frames = int(loaded.options["reference_frames"])
    audio = reference_audio(loaded, reference_frames, seed)
    speaker, speech = stages["speaker_encoder"], stages.get("speech_encoder")
    transcript = np.random.default_rng(seed + VOICE_SEED_OFFSET + 1).integers(0, plain_text_bound(config), 6)
    ref_ids = None if speech is None else rn.reference_ids(transcript, rn.ChatTokens.from_config(config))
    device = rn.voice_prompt(audio, speaker, speech, ref_ids)
    official = official_voice_prompt(loaded.models, audio, ref_ids)
    failures = []
    embedding_db = snr_db(official.speaker_embedding, device.speaker_embedding)
    if not embedding_db >= speaker.gate_db:
        failures.append(f"voice clone: the speaker embedding the exported speaker_encoder made from the reference audio "
                        f"scores {embedding_db:.1f} dB against the official one, below its {speaker.gate_db:.1f} dB gate")
    block = {"reference_frames": reference_frames, "mode": "in-context" if device.in_context else "x-vector",
             "speaker_embedding_db": embedding_db, "speaker_embedding_gate_db": speaker.gate_db,
             "speaker_embedding_cosine": cosine(official.speaker_embedding, device.speaker_embedding)}
    if device.in_context:
        differ = int(np.sum(device.ref_codes != official.ref_codes)) if device.ref_codes.shape == official.ref_codes.shape else None
        block["reference_codes_equal"] = differ == 0
        if differ != 0:
            failures.append("voice clone: the exported speech_encoder's reference codes differ from the official encode's "
                            + (f"({differ} of {official.ref_codes.size})" if differ is not None else
                               f"(shape {list(device.ref_codes.shape)} against {list(official.ref_codes.shape)})"))
    base = request or default_request(config, seed)
    spoken = compare(loaded, stages, frames, decoder_gate_db, replace(base, speaker=None, instruct=None, voice=device),
                     official_voice=official)
    failures += [f"voice clone: {f.removeprefix('official utterance: ')}" for f in spoken.pop("failures")]
    return {**block, "utterance": spoken, "failures": failures}


class SharedDraws:
    """Sampling noise both sides share: the runner picks with `numpy.random.Generator.choice(n, p=...)`
    (one uniform draw, inverse CDF), and while this context is open the official `generate()` draws
    through the same call on a generator seeded the same, in place of `torch.multinomial` (transformers'
    sampler). The talker and the code predictor draw in the same order on both sides (codebook 0,
    then codebooks 1-15, frame after frame), so equal distributions give equal codes; the official
    arithmetic is untouched."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def _draw(self, probs, num_samples, *args, **kwargs):
        rows = probs.detach().double().reshape(-1, probs.shape[-1]).numpy()
        picks = [self.rng.choice(row.size, p=row / row.sum()) for row in rows for _ in range(num_samples)]
        return torch.tensor(picks, dtype=torch.long).reshape(*probs.shape[:-1], num_samples)

    def __enter__(self):
        self._drawing = multinomial_drawn_by(self._draw)
        self._drawing.__enter__()
        return self

    def __exit__(self, *exc):
        return self._drawing.__exit__(*exc)


def sampled_compare(loaded, stages: dict, frames: int, seed: int, request: rn.Request | None = None) -> dict:
    """The official sampled utterance (the official defaults: temperature 0.9, top-k 50, both the
    talker and the code predictor sampling) against the runner's over the artifacts, both drawing
    from `SharedDraws(seed)`: frames compared, codes equal, the first difference. Where the predictor
    stage is the frame graph (its Gumbel noise is no draw of the official sampler) codebooks 1-15 are
    greedy on both sides and only the talker samples (`predictor_sampling` False)."""
    config = config_of(loaded)
    request = request or default_request(config, int(loaded.options.get("seed", 0)))
    official = off.wrap(loaded.models.talker, loaded.models.decoder, config)
    stepped = graphs(stages).code_predictor_step is not None
    settings = rn.Settings(max_new_tokens=frames + 1, subtalker_dosample=stepped)
    with SharedDraws(seed):
        ref_codes, _ = off.official_run(official, request, settings)
    utt = rn.Runner(graphs(stages), tables(loaded.models.talker), rn.Vocabulary.from_config(config)).generate(
        request, settings, np.random.default_rng(seed))
    compared = min(len(ref_codes), len(utt.codes))
    difference = None
    for f in range(compared):
        k = next((i for i in range(rn.GROUPS) if ref_codes[f, i] != utt.codes[f, i]), None)
        if k is not None:
            difference = {"frame": f, "codebook": k, "official": int(ref_codes[f, k]), "runner": int(utt.codes[f, k])}
            compared = f
            break
    return {"seed": seed, "predictor_sampling": stepped, "official_frames": len(ref_codes), "runner_frames": len(utt.codes),
            "frames_compared": compared, "codes_equal": difference is None and len(ref_codes) == len(utt.codes),
            "first_difference": difference}


SAMPLED_FRAMES = 6  # frames of the pipeline's sampled comparison: a few frames draw ~100 codes
SAMPLED_SEED_OFFSET = 900  # its shared draws: apart from the request's and the in-situ utterance's


def _entry(stage) -> dict:
    return getattr(stage, "step", stage).entry  # in_situ's _StepLoop wraps the step graph's stage


def _default(loaded, voice=None) -> rn.Request:
    """The checkpoint's default request, cloning `voice` (a voice-prompt file) where one is given."""
    config, seed = config_of(loaded), int(loaded.options.get("seed", 0))
    return voice_request(config, seed, voice) if voice is not None else default_request(config, seed)


def sampled(loaded, stages: dict, frames: int, request: rn.Request | None = None, voice=None) -> dict:
    """The sampled-utterance block of the pipeline report, with its `failures`: `sampled_compare` over
    at most `SAMPLED_FRAMES` frames of the greedy comparison's request. Gated where it can mean
    something: with fp32 talker and predictor artifacts (fp32 in and out) every drawn code equals the
    official one; at lower precisions a difference may be a draw between near-equal probabilities,
    which no tie check can tell from a fault, so the block is informational and says so."""
    seed = int(loaded.options.get("seed", 0))
    request = request or _default(loaded, voice)
    block = sampled_compare(loaded, stages, min(frames, SAMPLED_FRAMES), seed + SAMPLED_SEED_OFFSET, request)
    used = {n: _entry(stages[n]) for n in ("talker_prefill", "talker_decode", "code_predictor")}
    # a stage whose entry names no precision is not known to be fp32: never gated exactly
    precisions = {n: str(e.get("precision")) if (e.get("io_float_dtype") or "float32") == "float32"
                  else f"{e.get('precision')} ({e['io_float_dtype']} I/O)" for n, e in used.items()}
    exact = all(p == "fp32" for p in precisions.values())
    block["precisions"], block["gated"] = precisions, exact
    if not block["predictor_sampling"]:
        block["predictor_note"] = ("codebooks 1-15 greedy on both sides: the predictor stage is the frame graph, whose "
                                   "Gumbel noise is no draw of the official sampler (the step graph samples)")
    failures = []
    if not exact:
        lower = ", ".join(f"{n} {p}" for n, p in precisions.items() if p != "fp32")
        block["note"] = (f"informational, not gated: {lower}; a sampled code drawn among near-equal probabilities may "
                         "differ without a fault, and a draw has no tie margin to check")
    elif block["first_difference"] is not None:
        d = block["first_difference"]
        failures.append(f"sampled utterance: frame {d['frame']} codebook {d['codebook']}: the runner drew {d['runner']} where "
                        f"the official sampled generate() drew {d['official']} from the same draws (fp32 artifacts: every "
                        "code must be equal)")
    elif not block["codes_equal"]:
        failures.append(f"sampled utterance: the official sampled generate() made {block['official_frames']} frames, the "
                        f"runner {block['runner_frames']} from the same draws (fp32 artifacts: every code must be equal)")
    return {**block, "failures": failures}
