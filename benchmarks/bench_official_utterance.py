"""The official-utterance matrix: every published Qwen3-TTS variant x request kind x artifact format,
the runner (`edgex/recipes/qwen3_tts/runner.py`) over edgex's artifacts against the official
`generate()` (qwen-tts 0.1.1), greedy (`do_sample=False`, `subtalker_dosample=False`).

    .venv/bin/python benchmarks/bench_official_utterance.py --out OUT [--variant custom_voice ...] [--format onnx:fp32 ...]

Per variant: a small checkpoint built with the official classes (the published config's tables, the
tiny preset's widths; `official.build`), its EOS row set so the variant's default request stops after
`--stop` frames (`official.stop_at`), written in the published layout and exported by the edgex CLI:
talker_prefill, talker_decode and code_predictor_step in every `--format`, the decoder pair in ONNX
fp32. Then for every request kind and format, `utterance.compare` (what `edgex pipeline` reports):
frames compared, codes equal, the first difference (and whether it is a near-tie of the official
scores at the in-situ tie level), the waveform over the agreed frames: the figure the decoder is gated
on (the spectral figure, `FACTS.spectral_outputs`) with its SNR in brackets. Requests other than the
default run until EOS or `--frames` (the EOS row is placed for the default request only). The default
request also runs sampled with the official defaults, both sides drawing from one seeded generator
(`utterance.SharedDraws`).

Base also clones voices made from reference audio (`REFERENCE_FRAMES` frames the eager decoder made
from seeded codes): through the exported `speaker_encoder` and `speech_encoder` (ONNX fp32,
`runner.voice_prompt`, as a device clones) and through the official modules (`edgex voice-prompt`).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from edgex.recipes.qwen3_tts import official as off
from edgex.recipes.qwen3_tts import runner as rn
from edgex.recipes.qwen3_tts import utterance

FORMATS = ("onnx:fp32", "onnx:fp16", "executorch:fp32", "executorch:fp16")
GRAPHS = ("talker_prefill", "talker_decode", "code_predictor_step", "code2latent", "latent2wav")
VOICE_GRAPHS = ("speaker_encoder", "speech_encoder")
REFERENCE_FRAMES = 20


def requests(variant: str, config: dict) -> dict[str, rn.Request]:
    """The default request (the one `edgex pipeline` runs) and the variant's other published kinds."""
    default = utterance.default_request(config, 0)
    rng = np.random.default_rng(11)
    text = rn.chat_ids(rng.integers(0, rn.IM_START, 10))
    out = {"default (streaming)": default,
           "default, non-streaming": rn.Request(**{**default.__dict__, "non_streaming": True})}
    if variant == "custom_voice":
        out["eric, auto -> sichuan dialect"] = rn.Request(text, language="auto", speaker="eric")
        out["dylan, chinese -> beijing dialect, non-streaming"] = rn.Request(text, language="chinese", speaker="dylan", non_streaming=True)
        out["ryan, auto (no language row)"] = rn.Request(text, language="auto", speaker="ryan")
        out["vivian, english + instruct"] = rn.Request(text, language="english", speaker="vivian",
                                                      instruct=rn.instruct_ids(rng.integers(0, rn.IM_START, 6)))
    elif variant == "base":
        voice = rn.VoicePrompt(default.voice.speaker_embedding, rng.integers(0, rn.AUDIO_CODES, (6, rn.GROUPS)),
                               rn.reference_ids(rng.integers(0, rn.IM_START, 5)))
        out["in-context (streaming)"] = rn.Request(text, language="english", voice=voice)
        out["in-context, non-streaming"] = rn.Request(text, language="english", voice=voice, non_streaming=True)
        short = rn.VoicePrompt(voice.speaker_embedding, rng.integers(0, rn.AUDIO_CODES, (20, rn.GROUPS)), voice.ref_ids)
        out["in-context, reference longer than text"] = rn.Request(text, language="english", voice=short)
    else:
        out["instruct, auto language"] = rn.Request(text, language="auto", instruct=default.instruct)
    return out


def voice_requests(model, folder: Path, checkpoint: Path, text) -> dict[str, rn.Request]:
    """Base requests whose voice prompt is made from reference audio: by the exported encoders (the
    runner's on-device path) and by the official modules (what `edgex voice-prompt` writes)."""
    import onnxruntime as ort
    import torch

    from edgex.recipes.qwen3_tts.models import load_checkpoint
    from edgex.recipes.qwen3_tts.voice_prompt import official_voice_prompt
    from edgex.verify import find_manifest, load_manifest

    codes = torch.from_numpy(np.random.default_rng(21).integers(0, rn.AUDIO_CODES, (1, rn.GROUPS, REFERENCE_FRAMES)))
    with torch.no_grad():
        audio = model.decoder(codes).reshape(-1).numpy()
    entries = {e["component"]: e for e in load_manifest(find_manifest(folder))["artifacts"] if e["format"] == "onnx"}

    def graph(name):
        session = ort.InferenceSession(str(folder / entries[name]["files"][0]["path"]))
        return lambda inputs: session.run(None, {i.name: x for i, x in zip(session.get_inputs(), inputs)})

    ref_ids = rn.reference_ids(np.random.default_rng(22).integers(0, rn.IM_START, 6))
    device = rn.voice_prompt(audio, graph("speaker_encoder"), graph("speech_encoder"), ref_ids)
    official = official_voice_prompt(load_checkpoint(checkpoint), audio, ref_ids)
    return {"voice from audio, exported encoders, in-context": rn.Request(text, language="english", voice=device),
            "voice from audio, exported encoders, x-vector": rn.Request(text, language="english",
                                                                        voice=rn.VoicePrompt(device.speaker_embedding)),
            "voice from audio, official modules (edgex voice-prompt), in-context": rn.Request(text, language="english", voice=official)}


def waveform(report: dict) -> str:
    """The waveform figure the decoder's gate judges (`utterance.gated_wav_figure`: the spectral
    figure where the recipe declares the decoder's wav spectral), with its SNR in brackets."""
    if report["wav_db"] is None:
        return "-"
    figure, _ = utterance.gated_wav_figure(report, "wav")
    if "wav_spectral_db" not in report:
        return f"{figure:.1f} (SNR)"
    return f"{figure:.1f} (SNR {report['wav_db']:.1f})"


def export(checkpoint: Path, out: Path, formats: list[str], voice: bool = False) -> Path:
    places = [f"{role}={fmt}" for fmt in formats for role in ("talker", "code_predictor_step")] + ["decoder=onnx:fp32"]
    graphs = GRAPHS + (VOICE_GRAPHS if voice else ())
    components = [a for c in graphs for a in ("--component", c)]
    places += ["voice=onnx:fp32"] if voice else []
    cmd = [sys.executable, "-m", "edgex", "export", "qwen3-tts", "--checkpoint", str(checkpoint), "--target", "cpu",
           "--out", str(out), *components, "--placement", ",".join(places), "--jobs", "2", "--json",
           *(["--set", f"reference_frames={REFERENCE_FRAMES}"] if voice else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"export failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return out / "qwen3-tts" / "cpu"


def stages_for(folder: Path, fmt: str) -> dict:
    from edgex.in_situ import _choose, _stage
    from edgex.recipes import RECIPES
    from edgex.verify import find_manifest, load_manifest

    recipe = RECIPES.get("qwen3-tts")
    manifest = load_manifest(find_manifest(folder))
    names = ["talker_prefill", "talker_decode", "code_predictor_step", "code2latent", "latent2wav"]
    chosen = _choose([(folder, manifest)], recipe.facts, names, [f"talker={fmt}", f"code_predictor_step={fmt}", "decoder=onnx:fp32"])
    return {n: _stage(n, e, root, 2, {}) for n, (root, e) in chosen.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--variant", action="append", choices=list(off.VARIANTS))
    parser.add_argument("--format", action="append", choices=FORMATS)
    parser.add_argument("--stop", type=int, default=12, help="frames of the default request's official utterance")
    parser.add_argument("--frames", type=int, default=24, help="most frames per utterance")
    args = parser.parse_args()
    import torch

    from edgex.in_situ import _choose  # noqa: F401  (fails early if the tree is broken)
    from edgex.recipes import RECIPES
    from edgex.recipes.qwen3_tts.in_situ import _predictor

    torch.set_num_threads(2)
    recipe, rows = RECIPES.get("qwen3-tts"), []
    formats = args.format or list(FORMATS)
    print("| variant | request | format | frames compared | official frames | codes equal | first difference "
          "| waveform dB: spectral (SNR) |", flush=True)
    for variant in args.variant or list(off.VARIANTS):
        started = time.perf_counter()
        model = off.build(variant, seed=0)
        config = model.model.config.to_dict()
        off.stop_at(model, utterance.default_request(config, 0), args.stop)
        checkpoint = off.write_checkpoint(model, args.out / variant / "checkpoint")
        folder = export(checkpoint, args.out / variant / "out", formats, voice=variant == "base")
        loaded = recipe.load(None, checkpoint, 0)
        print(f"{variant}: built and exported in {time.perf_counter() - started:.0f} s", flush=True)
        for fmt in formats:
            stages = stages_for(folder, fmt)
            stages["code_predictor"] = _predictor(stages, loaded.models.talker)
            gate = max(stages["code2latent"].gate_db, stages["latent2wav"].gate_db)
            kinds = requests(variant, config)
            if variant == "base":
                kinds |= voice_requests(model, folder, checkpoint, kinds["in-context (streaming)"].text_ids)
            for name, request in kinds.items():
                report = utterance.compare(loaded, stages, args.frames, gate, request)
                d = report["first_difference"]
                rows.append({"variant": variant, "request": name, "format": fmt, **report})
                diff = "-" if d is None else f"f{d['frame']} cb{d['codebook']} {'tie' if d['tie'] else 'NOT a tie'} ({d['margin']:.3g} vs {d['tie_margin']:.3g})"
                wav = waveform(report)
                print(f"| {variant} | {name} | {fmt} | {report['frames_compared']} | {report['official_frames']}"
                      f"{' EOS' if report['official_stopped'] else ''} | {'yes' if report['codes_equal'] else 'no'} | {diff} | {wav} |",
                      flush=True)
            sampled = utterance.sampled_compare(loaded, stages, args.frames, seed=5)
            rows.append({"variant": variant, "request": "default, sampled, shared draws (seed 5)", "format": fmt, **sampled})
            print(f"| {variant} | default, sampled (official defaults), shared draws seed 5 | {fmt} | {sampled['frames_compared']} | "
                  f"{sampled['official_frames']} | {'yes' if sampled['codes_equal'] else 'no'} | {sampled['first_difference'] or '-'} | - |",
                  flush=True)
    (args.out / "official_utterance.json").write_text(json.dumps(rows, indent=1, default=float))


if __name__ == "__main__":
    main()
