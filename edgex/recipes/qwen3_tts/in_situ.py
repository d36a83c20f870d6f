"""In-situ parity for Qwen3-TTS: the exported talker, code predictor and streaming decoder composed
the way a device runs them, against the eager pipeline (`pipeline.Utterance`: the unmodified HF
talker and code predictor, sampling with Gumbel noise) on the same seed and the same noise.

- teacher-forced: the artifacts' own state (the talker's KV cache grows from the artifacts' K/V),
  tokens forced to the eager ones; each stage scored against the eager pipeline at the same point;
- free-running: the artifacts sample their own codes from the same noise; token agreement, the first
  divergence with the eager reference's margin there, and the final audio against the eager audio;
- streaming: chunk schedules as servers run them (the eager decoder over 72 frames of left context
  plus the chunk, kept new samples) and the exact artifact pair in 25-frame chunks, against the
  offline decode, with the playback gap each schedule leaves at this machine's measured speeds;
- official utterance: the runner (`runner.py`) over the artifacts against the official `generate()`
  on the checkpoint variant's own request, greedy, until EOS, and sampled over a few frames with
  both sides drawing from the same seeded draws (`utterance.py`);
- voice clone (Base, where the folders hold the `speaker_encoder` and maybe the `speech_encoder`):
  the voice prompt made from reference audio through those artifacts, the runner's utterance with it
  against the official `generate()` with the official modules' prompt from the same audio.

The decoder stage is the exact streaming pair, or, where the folders hold only Code2Wav's windowed
graph (`code2wav`: llama.cpp's libmtmd runs no other), that graph chunk by chunk; it serves the greedy
pass of a predictor that draws its own samples, the passes above needing the pair.

Stages are `edgex.in_situ.Stage`s; nothing here knows formats."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import torch

from ...parity.check import flips, tie_margin
from ...parity.metrics import median, snr_db
from . import predictor, talker, utterance
from . import code2wav
from .code2wav import receptive_field_frames
from .pipeline import AUDIO_CODES, Utterance, padded_cache

if TYPE_CHECKING:
    from ...in_situ import Stage

# The predictor stage is the whole-frame graph, or the step graph looped 16 times a frame by the runner
# (`_StepLoop`: what a target that places only the step graph deploys).
PREDICTOR = ("code_predictor", "code_predictor_step")
# The decoder stage is the exact streaming pair, or Code2Wav's windowed graph where the folders hold no
# pair (llama.cpp: libmtmd runs Code2Wav only as that graph; `runner.WindowedDecoder`).
PAIR = ("code2latent", "latent2wav")
DECODER = (PAIR, "code2wav")
COMPONENTS = ("talker_prefill", "talker_decode", PREDICTOR, DECODER)
# The voice-prompt encoders a Base app clones with, composed where the folders hold them (`voice_clone`).
VOICE = ("speaker_encoder", "speech_encoder")
STAGES = ("talker_prefill", "talker_decode", "code_predictor", "code2latent", "latent2wav")  # report keys
FRAME_SECONDS = 0.08
SAMPLES_PER_FRAME = 1920
LEFT_CONTEXT = 72  # frames of codes a streaming server decodes before each chunk
CHUNK = 25
SCHEDULES = {"1 then 25": (1,), "ramp 2/4/8/16 then 25": (2, 4, 8, 16), "25": ()}
DEFAULT_FRAMES = 40  # frames an in-situ run generates unless told (fewer where the talker has fewer KV slots)
SEED_OFFSET = 500  # the pipeline's utterance: neither a parity sample (seed, seed + 1) nor calibration (seed + 1000 + i)


def default_frames(slots: int, prefill_len: int) -> int:
    """Frames of a default in-situ run: its last talker decode call is at position
    prefill_len + frames - 1 (the talker decode graph samples that position too)."""
    return min(slots - prefill_len, DEFAULT_FRAMES)


def chunks(schedule: tuple[int, ...], frames: int) -> list[tuple[int, int]]:
    """[start, end) of each chunk: the schedule's first sizes, then CHUNK frames, cut at `frames`."""
    out, start, sizes = [], 0, list(schedule)
    while start < frames:
        end = min(frames, start + (sizes.pop(0) if sizes else CHUNK))
        out.append((start, end))
        start = end
    return out


class _StepLoop:
    """The code predictor as a device runner drives `code_predictor_step`: per frame, step 0 on the
    talker hidden, then steps 1..15 each on the code sampled from the previous step's logits (the
    same Gumbel-max as the frame graph: argmax of logits + noise), the K/V each step returns written
    into the runner's 15-slot cache. Same inputs and outputs as the frame graph (codes, logits,
    codec_embeds); the codec embedding sum the talker's next input needs is the runner's table lookup
    (like the text embedding, the tables sit beside the graphs: the step graph holds no codebook-15
    table). `times_ms`: one entry per frame, the sum of its 16 calls."""

    def __init__(self, step: Stage, talker):
        self.step, self.component, self.gate_db, self.tie_db = step, step.component, step.gate_db, step.tie_db
        shapes = {spec["name"]: spec["shape"] for spec in step.entry["inputs"]}
        self.cache_shape = shapes["past_key"]
        predictor_tables = talker.code_predictor.model.codec_embedding
        with torch.no_grad():
            self.tables = [talker.model.codec_embedding.weight.numpy()] + [t.weight.numpy() for t in predictor_tables]
        self.times_ms: list[float] = []

    def __call__(self, inputs) -> list[np.ndarray]:
        hidden, code0, noise = inputs
        key, value = np.zeros(self.cache_shape, np.float32), np.zeros(self.cache_shape, np.float32)
        slots, code, codes, logits = self.cache_shape[3], np.asarray(code0, np.int64).reshape(1, 1), [], []
        calls = len(self.step.times_ms)
        for s in range(predictor.GROUPS + 1):
            step_logits, new_key, new_value = self.step([hidden, code, np.array([s], np.int64), key, value])
            if s < slots:
                key[:, :, :, s : s + 1], value[:, :, :, s : s + 1] = new_key, new_value
            if s:
                logits.append(step_logits)
                code = np.argmax(step_logits + noise[:, s - 1 : s], axis=-1).astype(np.int64)
                codes.append(code)
        self.times_ms.append(sum(self.step.times_ms[calls:]))
        embeds = self.tables[0][code0.reshape(-1)] + sum(t[c.reshape(-1)] for t, c in zip(self.tables[1:], codes))
        return [np.concatenate(codes, axis=1), np.concatenate(logits, axis=1), embeds[None].astype(np.float32)]


def decoder_components(stages: dict) -> tuple[str, ...]:
    """The components serving the decoder stage: the pair, or the windowed `code2wav`."""
    return PAIR if PAIR[0] in stages else ("code2wav",)


def decoder_gate_db(stages: dict) -> float:
    """The gate the decoder's waveform is judged on: the looser of its components' gates."""
    return max(stages[n].gate_db for n in decoder_components(stages))


def draws_own_samples(stages: dict) -> str | None:
    """Why the predictor artifact cannot take the eager pipeline's sampling noise (it draws its own
    samples: llama.cpp's libmtmd, run greedy), or None."""
    stage = stages.get("code_predictor")
    if stage is None:
        return None
    probe = [np.zeros((1, 1, 1), np.float32), np.zeros((1, 1), np.int64), np.ones((1, predictor.GROUPS, AUDIO_CODES), np.float32)]
    return stage.session.cannot_run(probe)


def greedy_in_situ(loaded, stages: dict, settings: dict, progress, why: str) -> dict:
    """The pipeline of a predictor that draws its own samples, as llama.cpp's TTS drives it: the
    runner over the artifacts, greedy, on the checkpoint's own request in the non-streaming layout
    llama.cpp's `mtmd_helper` functions build (the whole text in the prompt, `tts_pad` a frame), against the
    official `generate()` on the same request. The passes that feed the eager pipeline's sampling
    noise (teacher-forced, free-running, sampled) cannot run; each says why."""
    from dataclasses import replace

    options = loaded.options
    frames = settings.get("frames") or default_frames(options["max_context"], options["prefill_len"])
    request = settings.get("request")
    request = None if request is None else utterance.request_from(loaded, request, settings.get("request_base"))
    if request is None:
        request = utterance.voice_request(utterance.config_of(loaded), 0, settings["voice"]) if settings.get("voice") is not None \
            else utterance.default_request(utterance.config_of(loaded), int(options.get("seed", 0)))
    request = replace(request, non_streaming=True)
    decoder = " + ".join(decoder_components(stages))
    progress(f"official utterance (greedy, non-streaming, decoder {decoder}): the runner against the official generate()")
    official = utterance.compare(loaded, stages, frames, decoder_gate_db(stages), request)
    failures = official.pop("failures")
    note = {"note": f"not run: {why}"}
    return {"frames": frames, "seed": int(options.get("seed", 0)), "mode": "greedy (the predictor draws its own samples)", "decoder": decoder,
            "teacher_forced": note, "free_running": note, "sampled_utterance": note,
            "official_utterance": official, "failures": failures}


def _predictor(stages: dict, talker):
    """The predictor stage: the frame graph's artifact, or the step graph's driven by `_StepLoop`."""
    return stages["code_predictor"] if "code_predictor" in stages else _StepLoop(stages["code_predictor_step"], talker)


class _Runner:
    """The artifacts' talker + predictor loop; `forced` frames make it teacher-forced."""

    def __init__(self, stages, utt: Utterance, slots: int):
        self.stages, self.utt, self.slots = stages, utt, slots

    def run(self, frames: int, forced: list[dict] | None) -> dict:
        prefill, decode, frame_graph = (self.stages[n] for n in STAGES[:3])
        logits, hidden, key, value = prefill([self.utt.prefill_embeds.numpy()])
        length = key.shape[3]
        past_key = padded_cache(torch.from_numpy(key), self.slots).numpy()
        past_value = padded_cache(torch.from_numpy(value), self.slots).numpy()
        logits, hidden = logits[:, -1:], hidden[:, -1:]
        record = {"prefill": (logits, hidden), "frames": []}
        for f in range(frames):
            rec = self.utt.frame(f)
            scores = logits[..., :AUDIO_CODES] + rec["code0_noise"].numpy()
            code0 = forced[f]["code0"].numpy() if forced else np.argmax(scores, axis=-1).astype(np.int64)
            codes, frame_logits, codec_embeds = frame_graph([hidden, code0, rec["noise"].numpy()])
            embeds = forced[f]["next_embeds"].numpy() if forced else codec_embeds + self.utt.text_embed(f).numpy()
            record["frames"].append(dict(talker_logits=logits, talker_hidden=hidden, code0=code0, codes=codes,
                                         predictor_logits=frame_logits))
            position = length + f
            logits, hidden, new_key, new_value = decode([embeds, np.array([position], np.int64), past_key, past_value])
            past_key[:, :, :, position : position + 1] = new_key
            past_value[:, :, :, position : position + 1] = new_value
        record["after"] = (logits, hidden)  # the last decode: the talker's output for frame `frames`
        record["codes"] = np.concatenate([np.concatenate((r["code0"], r["codes"]), axis=1)[0][:, None] for r in record["frames"]],
                                         axis=1)[None]
        return record


def _first_divergence(models, utt: Utterance, run: dict, ties: dict) -> dict | None:
    """Where the artifacts' sampled codes first differ from the eager ones, and the eager reference's
    margin there: its own sampling score of its choice minus that of the artifacts' choice, with the
    tie margin the stage's in-situ tie gate allows (`Stage.tie_db`, `edgex.parity.check.tie_margin`)."""
    for f, got in enumerate(run["frames"]):
        rec = utt.frame(f)
        want = torch.cat((rec["code0"], rec["codes"]), dim=1)[0].numpy()
        have = np.concatenate((got["code0"], got["codes"]), axis=1)[0]
        differ = np.nonzero(want != have)[0]
        if not len(differ):
            continue
        k = int(differ[0])
        with torch.no_grad():
            if k == 0:  # code 0 is sampled from the talker's logits: frame 0's come from the prefill
                logits = models.talker.codec_head(rec["talker_hidden"])[0, 0, :AUDIO_CODES].numpy()
                noise, stage = rec["code0_noise"][0, 0].numpy(), "talker_prefill" if f == 0 else "talker_decode"
            else:
                logits = predictor.frame_reference(models.talker, rec["talker_hidden"], rec["code0"], rec["noise"])[1][0, k - 1].numpy()
                noise, stage = rec["noise"][0, k - 1].numpy(), "code_predictor"
        scores = logits.astype(np.float64) + noise
        margin = float(scores[want[k]] - scores[have[k]])
        allowed = tie_margin(ties[stage], logits)
        return {"frame": f, "codebook": k, "stage": stage, "reference": int(want[k]), "artifact": int(have[k]),
                "margin": margin, "tie_margin": allowed, "tie_db": ties[stage], "tie": margin <= allowed}
    return None


def _gap(schedule: list[tuple[int, int]], start_s: float, frame_s: float, decode_s: list[float]) -> dict:
    """One compute stream generating frames and decoding each chunk as soon as it is complete; playback
    starts with the first chunk and stalls whenever the next one is not ready."""
    t, playing_until, gaps, first = start_s, None, [], None
    for (start, end), decode in zip(schedule, decode_s):
        t += (end - start) * frame_s + decode
        if playing_until is None:
            first, playing_until = t, t
        else:
            gaps.append(max(0.0, t - playing_until))
            playing_until = max(t, playing_until)
        playing_until += (end - start) * FRAME_SECONDS
    return {"ttfa_ms": round(first * 1000, 1), "gap_after_first_chunk_ms": round(gaps[0] * 1000, 1) if gaps else 0.0,
            "total_gap_ms": round(sum(gaps) * 1000, 1), "worst_gap_ms": round(max(gaps, default=0.0) * 1000, 1)}


def in_situ(loaded, stages: dict, settings: dict, progress) -> dict:
    import time

    models, options = loaded.models, loaded.options
    slots, prefill_len = options["max_context"], options["prefill_len"]
    request = settings.get("request")  # the official utterance's, checked before anything runs
    request = None if request is None else utterance.request_from(loaded, request, settings.get("request_base"))
    if settings.get("voice") is not None:
        utterance.voice_request(utterance.config_of(loaded), 0, settings["voice"])
    frames = settings.get("frames") or default_frames(slots, prefill_len)
    # The schedules need more frames than the left context to show what it truncates: the eager
    # utterance goes on past the artifacts' frames (it is generated lazily, frame by frame, so its
    # first frames are the same however long it is).
    stream_frames = max(settings.get("stream_frames") or 2 * CHUNK + LEFT_CONTEXT, frames)
    # The eager utterance reaches one frame past the artifacts' last: the talker's decode after the last
    # frame is scored too, so `--frames 1` scores talker_decode once.
    if not 0 < frames <= slots - prefill_len:
        from ...errors import EdgexError

        raise EdgexError(f"--frames must be 1..{slots - prefill_len} (the talker graph's {slots} KV slots minus the "
                         f"{prefill_len}-position prompt)")
    why = draws_own_samples(stages)
    if why:
        return greedy_in_situ(loaded, stages, settings, progress, why)
    if decoder_components(stages) != PAIR:
        from ...errors import EdgexError

        raise EdgexError("the pipeline's noise-fed passes (teacher-forced, free-running, streaming schedules) decode with the "
                         "exact streaming pair; the folders serve Code2Wav's windowed graph (code2wav) only: export or place "
                         "code2latent and latent2wav (e.g. --placement code2latent=onnx:fp32 --placement latent2wav=onnx:fp32)")
    stages = {**stages, "code_predictor": _predictor(stages, models.talker)}  # a looped step graph stays too: its calls are timed
    looped = isinstance(stages["code_predictor"], _StepLoop)
    gates = {n: s.gate_db for n, s in stages.items()}
    failures = []
    utt = Utterance(models.talker, prefill_len, max(stream_frames, frames + 1), options["seed"] + SEED_OFFSET)
    eager_frames = [utt.frame(f) for f in range(frames)]
    eager_codes = np.stack([torch.cat((r["code0"], r["codes"]), dim=1)[0].numpy() for r in eager_frames], axis=-1)[None]
    with torch.no_grad():
        eager_wav = models.decoder(torch.from_numpy(eager_codes)).numpy()
    runner = _Runner(stages, utt, slots)

    # (a) teacher-forced: tokens forced, state the artifacts' own
    progress("teacher-forced pass")
    forced = runner.run(frames, eager_frames)
    with torch.no_grad():
        ref_prefill = talker.prefill_reference(models.talker, utt.prefill_embeds)
    tf = {"talker_prefill": {"logits_db": snr_db(ref_prefill[0][:, -1:].numpy(), forced["prefill"][0]),
                             "hidden_db": snr_db(ref_prefill[1][:, -1:].numpy(), forced["prefill"][1])}}
    hidden_db, logits_db, pred_db, agree, tf_flips = [], [], [], [], []
    for f in range(1, frames + 1):  # frame f's talker input is the decode output after frame f - 1
        want = utt.frame(f)["talker_hidden"]
        got_logits, got_hidden = forced["after"] if f == frames else (forced["frames"][f][k] for k in ("talker_logits", "talker_hidden"))
        hidden_db.append(snr_db(want.numpy(), got_hidden))
        with torch.no_grad():
            logits_db.append(snr_db(models.talker.codec_head(want).numpy(), got_logits))
    eager_predictor_ms = []
    for f in range(frames):
        rec, got = eager_frames[f], forced["frames"][f]
        start = time.perf_counter()
        with torch.no_grad():
            ref = predictor.frame_reference(models.talker, rec["talker_hidden"], rec["code0"], rec["noise"],
                                            forced_codes=torch.from_numpy(got["codes"].astype(np.int64)))
        eager_predictor_ms.append((time.perf_counter() - start) * 1000)
        pred_db.append(snr_db(ref[1].numpy(), got["predictor_logits"]))
        agree.append(float(np.mean(rec["codes"].numpy() == got["codes"])))
        # on the eager talker's history, every code the predictor samples must be the eager choice on
        # its own codes or a near-tie at the in-situ level (one frame's flips are independent of the last's)
        logits = ref[1].numpy()
        for flip in flips(logits + rec["noise"].numpy(), logits, got["codes"], stages["code_predictor"].tie_db):
            tf_flips.append({"frame": f, "codebook": flip.pop("position") + 1, **flip})
    tf["talker_decode"] = {"hidden_db_min": min(hidden_db, default=None), "logits_db_min": min(logits_db, default=None),
                           "hidden_db_median": median(hidden_db)}
    tf["code_predictor"] = {"component": stages["code_predictor"].component, "logits_db_min": min(pred_db), "logits_db_median": median(pred_db), "codes_agreement": float(np.mean(agree)),
                            "flips": tf_flips}
    streamed = utterance.streaming_decoder(stages)(eager_codes)
    decoder_gate = max(gates["code2latent"], gates["latent2wav"])
    tf["decoder"] = {**utterance.wav_figures(eager_wav, streamed, "wav"), "gate_db": decoder_gate}
    decoder_figure, what = utterance.gated_wav_figure(tf["decoder"], "wav")
    for stage, figure, gate in (("talker_prefill", tf["talker_prefill"]["logits_db"], gates["talker_prefill"]),
                                ("talker_decode", tf["talker_decode"]["logits_db_min"], gates["talker_decode"]),
                                (stages["code_predictor"].component, tf["code_predictor"]["logits_db_min"], gates["code_predictor"]),
                                (f"decoder (code2latent + latent2wav) {what}", decoder_figure, decoder_gate)):
        if figure is not None and not figure >= gate:
            failures.append(f"teacher-forced {stage}: {figure:.1f} dB below its {gate:.1f} dB gate")
    wrong = [x for x in tf_flips if not x["tie"]]
    if wrong:
        x = wrong[0]
        failures.append(f"teacher-forced {stages['code_predictor'].component}: {len(wrong)} sampled code(s) not a near-tie "
                        f"of the eager scores, first frame {x['frame']} codebook {x['codebook']}: {x['artifact']} for "
                        f"{x['reference']}, margin {x['margin']:.4g} > tie margin {x['tie_margin']:.4g}")

    # (b) free-running: the artifacts sample their own codes from the same noise
    progress("free-running pass")
    for s in stages.values():
        s.times_ms.clear()
    started = time.perf_counter()
    free = runner.run(frames, None)
    wav = utterance.streaming_decoder(stages)(free["codes"])
    artifact_s = time.perf_counter() - started
    divergence = _first_divergence(models, utt, free, {n: s.tie_db for n, s in stages.items()})
    agreed = frames if divergence is None else divergence["frame"]
    prefix = agreed * SAMPLES_PER_FRAME
    fr = {"frames": frames, "code0_agreement": float(np.mean(free["codes"][0, 0] == eager_codes[0, 0])),
          "codes_agreement": float(np.mean(free["codes"] == eager_codes)), "first_divergence": divergence,
          **utterance.wav_figures(eager_wav, wav, "audio"), "agreed_frames": agreed,
          **(utterance.wav_figures(eager_wav[..., :prefix], wav[..., :prefix], "audio_agreed_frames") if agreed else {"audio_agreed_frames_db": None})}
    if divergence is not None and not divergence["tie"]:
        failures.append(f"free-running: frame {divergence['frame']} codebook {divergence['codebook']} ({divergence['stage']}) "
                        f"sampled {divergence['artifact']} where the eager pipeline sampled {divergence['reference']}, "
                        f"margin {divergence['margin']:.4g} > tie margin {divergence['tie_margin']:.4g}")
    if agreed:
        figure, what = utterance.gated_wav_figure(fr, "audio_agreed_frames")
        if not figure >= decoder_gate:
            failures.append(f"free-running audio over the {agreed} agreed frames: {what} {figure:.1f} dB below "
                            f"the decoder's {decoder_gate:.1f} dB gate")

    # timing: the artifacts of the free-running pass, the eager model on the same work
    ms = {n: median(stages[n].times_ms) for n in STAGES}
    frame_ms = ms["talker_decode"] + ms["code_predictor"]
    decode_chunks = math.ceil(frames / CHUNK)
    eager = _eager_times(models, utt, eager_frames, frames, slots)
    eager["code_predictor"] = median(eager_predictor_ms)
    eager_frame_ms = eager["talker_decode"] + eager["code_predictor"]
    timing = {"artifact_ms": ms, "eager_ms": eager, "eager_over_artifact": {n: round(eager[n] / ms[n], 2) for n in ms if ms[n]},
              "per_frame_ms": {"artifact": round(frame_ms + (ms["code2latent"] + ms["latent2wav"]) / CHUNK, 3),
                               "eager": round(eager_frame_ms + (eager["code2latent"] + eager["latent2wav"]) / CHUNK, 3)},
              "free_running_wall_s": round(artifact_s, 3)}
    if looped:  # code_predictor: one frame's 16 calls of the step graph, summed
        timing["predictor_step_call_ms"] = median(stages["code_predictor"].step.times_ms)
    for who, per, table in (("artifact", frame_ms, ms), ("eager", eager_frame_ms, eager)):
        total = table["talker_prefill"] + frames * per + decode_chunks * (table["code2latent"] + table["latent2wav"])
        timing[f"{who}_rtf"] = round(total / 1000 / (frames * FRAME_SECONDS), 3)
        timing[f"{who}_ttfa_ms"] = round(table["talker_prefill"] + min(frames, CHUNK) * per + table["code2latent"] + table["latent2wav"], 1)

    # (c) streaming schedules against the offline decode, and their playback gaps here
    progress(f"streaming schedules over {stream_frames} eager frames")
    all_codes = utt.codes[..., :stream_frames]
    with torch.no_grad():
        offline = models.decoder(all_codes).numpy()
    for s in (stages["code2latent"], stages["latent2wav"]):
        s.times_ms.clear()
    exact = utterance.streaming_decoder(stages)(all_codes.numpy())
    pair_s = (median(stages["code2latent"].times_ms) + median(stages["latent2wav"].times_ms)) / 1000
    whole = chunks((), stream_frames)
    streaming = {"exact pair in 25-frame chunks (artifacts)": {
        "chunks": [e - s for s, e in whole], "db": snr_db(offline, exact),
        **_gap(whole, ms["talker_prefill"] / 1000, frame_ms / 1000, [pair_s] * len(whole))}}
    for name, schedule in SCHEDULES.items():
        plan = chunks(schedule, stream_frames)
        pieces, seconds = [], []
        for start, end in plan:
            left = max(0, start - LEFT_CONTEXT)
            began = time.perf_counter()
            with torch.no_grad():
                out = models.decoder(all_codes[..., left:end]).numpy()
            seconds.append(time.perf_counter() - began)
            pieces.append(out[..., (start - left) * SAMPLES_PER_FRAME :])
        streaming[f"{name}, {LEFT_CONTEXT} frames left context (eager decoder)"] = {
            "chunks": [e - s for s, e in plan], "db": snr_db(offline, np.concatenate(pieces, axis=-1)),
            **_gap(plan, ms["talker_prefill"] / 1000, frame_ms / 1000, seconds)}
    streaming["note"] = (f"dB: each schedule's audio against the offline decode of the same {stream_frames} eager frames; "
                         "gaps: one compute stream generating frames at the artifacts' measured talker + predictor ms and "
                         "decoding each chunk when complete (the artifacts' pair, or the eager decoder's measured time for "
                         "that chunk), playback from the first chunk on")
    # (d) the official utterance: the runner over the artifacts against the official generate()
    progress("official utterance: the runner against the official generate()")
    official = utterance.compare(loaded, stages, frames, decoder_gate, request, voice=settings.get("voice"))
    failures += official.pop("failures")
    progress("sampled utterance: the runner against the official sampled generate(), shared draws")
    sampled = utterance.sampled(loaded, stages, frames, request, voice=settings.get("voice"))
    failures += sampled.pop("failures")
    # (e) a voice cloned in situ: reference audio through the exported voice-prompt encoders
    voice = {"note": "not run: the folders hold no speaker_encoder artifact"}
    if "speaker_encoder" in stages:
        progress("voice clone: reference audio through the exported encoders, against the official generate()")
        voice = utterance.voice_clone(loaded, stages, frames, decoder_gate, request)
        failures += voice.pop("failures")
    return {"frames": frames, "stream_frames": stream_frames, "seed": options["seed"] + SEED_OFFSET, "teacher_forced": tf, "free_running": fr,
            "streaming": streaming, "timing": timing, "official_utterance": official,
            "sampled_utterance": sampled, "voice_clone": voice, "failures": failures}


def _eager_times(models, utt: Utterance, eager_frames, frames: int, slots: int) -> dict:
    """Median ms of the eager model on the stages' work: the prompt, talker steps over the eager
    cache, and the exact streaming pair's chunks (the unmodified HF modules, as the references run)."""
    import time

    def timed(call, *args, warm=False):
        if warm:  # first-call allocations are not the stage's cost
            timed(call, *args)
        start = time.perf_counter()
        with torch.no_grad():
            result = call(*args)
        return (time.perf_counter() - start) * 1000, result

    out = {"talker_prefill": timed(talker.prefill_reference, models.talker, utt.prefill_embeds, warm=True)[0]}
    steps = []
    for f in range(0, frames, max(1, frames // 8)):
        rec = eager_frames[f]
        key, value = utt.cache(rec["position"])
        steps.append(timed(talker.decode_reference, models.talker, rec["next_embeds"], torch.tensor([rec["position"]]),
                           padded_cache(key, slots), padded_cache(value, slots))[0])
    out["talker_decode"] = median(steps)
    dec = models.decoder
    cfg, context = dec.config, receptive_field_frames(dec)
    codes = utt.codes
    codes = torch.nn.functional.pad(codes, (0, -codes.shape[-1] % CHUNK))  # whole chunks (the cost does not depend on the codes)
    state = torch.zeros(1, cfg.codebook_dim, 2)
    key = torch.zeros(cfg.num_hidden_layers, 1, cfg.num_key_value_heads, cfg.sliding_window - 1, cfg.head_dim)
    value, latents = torch.zeros_like(key), torch.zeros(1, cfg.latent_dim, context)
    c2l, l2w = [], []
    for start in range(0, codes.shape[-1] - CHUNK + 1, CHUNK):
        ms, (latent, state, key, value) = timed(code2wav.code2latent_reference, dec, codes[..., start : start + CHUNK], torch.tensor([start]),
                                                state, key, value, warm=start == 0)
        c2l.append(ms)
        latents = torch.cat((latents, latent), dim=-1)[..., -(context + CHUNK):]
        l2w.append(timed(code2wav.latent2wav_reference, dec, context, latents, torch.tensor([min(start, context)]), warm=start == 0)[0])
    out["code2latent"], out["latent2wav"] = median(c2l), median(l2w)
    return {k: round(v, 3) if v is not None else None for k, v in out.items()}
