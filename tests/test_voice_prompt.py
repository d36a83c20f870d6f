"""Voice prompts of a Base checkpoint: a small Base model built with the official classes (its speaker
encoder and the speech tokenizer's encoder included), its voice-prompt graphs exported to ONNX fp32
with the talker, predictor and decoder graphs.

- `edgex voice-prompt` writes the prompt the official code makes from the same audio
  (`extract_speaker_embedding`, `Qwen3TTSTokenizerV2Model.encode`);
- the runner's on-device path (`runner.voice_prompt`: its numpy log-mel, the exported encoders)
  gives the same prompt, and a wrong mel spectrogram does not;
- `edgex pipeline --voice` clones that prompt and speaks the official in-context utterance;
- `edgex pipeline` clones a voice in situ through the exported encoders it finds, and a speaker
  encoder artifact that reads its mel bins reversed fails it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import built_once, cli_here, run_cli

pytestmark = pytest.mark.xdist_group("voice_prompt")  # the module fixture: built on one worker, never waited for

COMPONENTS = ("talker_prefill", "talker_decode", "code_predictor_step", "code2latent", "latent2wav",
              "speaker_encoder", "speech_encoder")
PLACE = "talker=onnx:fp32,code_predictor_step=onnx:fp32,decoder=onnx:fp32,voice=onnx:fp32"
REFERENCE_FRAMES = 12  # the voice graphs' reference length (80 ms frames)
FRAMES = 12
TRANSCRIPT = [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def base():
    """The Base checkpoint, its reference audio, its export and its voice prompt: built once per run
    (the model itself is rebuilt from its seed)."""
    from edgex.recipes.qwen3_tts import official

    model = official.build("base", seed=0)

    def make(root: Path) -> None:
        import torch
        from scipy.io import wavfile

        checkpoint = official.write_checkpoint(model, root / "checkpoint")
        _write_tokenizer(checkpoint)
        codes = torch.from_numpy(np.random.default_rng(4).integers(0, 2048, (1, 16, REFERENCE_FRAMES)))
        with torch.no_grad():
            audio = model.decoder(codes).reshape(-1).numpy()  # exactly the graphs' reference length
        wavfile.write(str(root / "reference.wav"), 24000, np.round(np.clip(audio, -1, 1) * 32767).astype(np.int16))
        components = [arg for c in COMPONENTS for arg in ("--component", c)]
        proc = cli_here("export", "qwen3-tts", "--checkpoint", str(checkpoint), "--target", "cpu", "--out", str(root / "out"),
                       *components, "--format", "onnx", "--precision", "fp32", "--placement", PLACE,
                       "--set", f"reference_frames={REFERENCE_FRAMES}", "--jobs", "2")
        assert proc.returncode == 0, proc.stderr[-3000:]
        made = cli_here("voice-prompt", "qwen3-tts", "--checkpoint", str(checkpoint), "--audio", str(root / "reference.wav"),
                       "--out", str(root / "voice.npz"), "--ids", ",".join(map(str, TRANSCRIPT)), "--json")
        assert made.returncode == 0, made.stderr[-2000:]
        (root / "written.json").write_text(made.stdout)

    root = built_once("voice-prompt", make)
    return {"model": model, "checkpoint": root / "checkpoint", "wav": root / "reference.wav",
            "folder": root / "out" / "qwen3-tts" / "cpu", "voice": root / "voice.npz",
            "written": json.loads((root / "written.json").read_text())}


WORDS = {"[UNK]": 0, "hello": 1, "world": 2, "again": 3}


def _write_tokenizer(checkpoint: Path) -> None:
    """A word-level tokenizer in the checkpoint folder (the published checkpoints ship Qwen2's)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel(WORDS, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(checkpoint / "tokenizer.json"))
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))


def _official(model, audio):
    """The official speaker embedding and reference codes of 24 kHz `audio` (the tokenizer model's
    own `encode`, with the model's encoder and decoder weights)."""
    import torch

    from edgex.recipes.qwen3_tts.qwen_tts_import import qwen_tts_modules

    mods = qwen_tts_modules()
    embedding = model.model.extract_speaker_embedding(audio, 24000).numpy()
    config = mods.tokenizer_config.Qwen3TTSTokenizerV2Config(encoder_config=model.speech_encoder.config.to_dict(),
                                                             decoder_config=model.decoder.config.to_dict())
    config.encoder_config._attn_implementation = config.decoder_config._attn_implementation = "eager"
    tokenizer = mods.tokenizer_modeling.Qwen3TTSTokenizerV2Model(config).eval()
    tokenizer.encoder.load_state_dict(model.speech_encoder.state_dict())
    wav = torch.from_numpy(audio)[None]
    with torch.no_grad():
        codes = tokenizer.encode(wav, torch.ones_like(wav, dtype=torch.long)).audio_codes[0].numpy()
    return embedding, codes


def _read(wav: Path) -> np.ndarray:
    from scipy.io import wavfile

    return (wavfile.read(str(wav))[1] / 32768.0).astype(np.float32)


def test_edgex_voice_prompt_writes_the_official_prompt(base, tmp_path):
    from edgex.parity.metrics import snr_db
    from edgex.recipes.qwen3_tts import runner as rn

    assert base["written"]["mode"] == "in-context" and base["written"]["ref_frames"] == REFERENCE_FRAMES
    prompt = rn.VoicePrompt.load(base["voice"])
    embedding, codes = _official(base["model"], _read(base["wav"]))
    assert snr_db(embedding, prompt.speaker_embedding) > 100
    np.testing.assert_array_equal(prompt.ref_codes, codes)
    np.testing.assert_array_equal(prompt.ref_ids, rn.reference_ids(TRANSCRIPT))

    from scipy.io import wavfile

    other = tmp_path / "44k.wav"
    wavfile.write(str(other), 44100, np.zeros(44100, np.int16))
    bad = run_cli("voice-prompt", "qwen3-tts", "--checkpoint", str(base["checkpoint"]), "--audio", str(other),
                  "--out", str(tmp_path / "voice.npz"))
    assert bad.returncode == 2 and "24000 Hz" in bad.stderr and "Traceback" not in bad.stderr


def test_the_exported_encoders_make_the_official_prompt_on_device(base):
    from edgex.parity.metrics import snr_db
    from edgex.recipes.qwen3_tts import runner as rn
    from edgex.verify import find_manifest, load_manifest
    import onnxruntime as ort

    folder = base["folder"]
    entries = {e["component"]: e for e in load_manifest(find_manifest(folder))["artifacts"]}
    for name in ("speaker_encoder", "speech_encoder"):
        assert entries[name]["parity"]["verdict"] == "pass"

    def graph(name):
        session = ort.InferenceSession(str(folder / entries[name]["files"][0]["path"]))
        return lambda inputs: session.run(None, {i.name: x for i, x in zip(session.get_inputs(), inputs)})

    audio = _read(base["wav"])
    prompt = rn.voice_prompt(audio, graph("speaker_encoder"), graph("speech_encoder"), rn.reference_ids(TRANSCRIPT))
    embedding, codes = _official(base["model"], audio)
    assert snr_db(embedding, prompt.speaker_embedding) > 60
    np.testing.assert_array_equal(prompt.ref_codes, codes)
    # a mel spectrogram without the log (a plausible porting slip) is another voice
    mels = np.exp(rn.log_mel(audio))
    wrong = np.asarray(graph("speaker_encoder")([mels])[0]).reshape(-1)
    assert snr_db(embedding, wrong) < 20


def test_the_pipeline_clones_a_voice_prompt_as_the_official_generate(base, tmp_path):
    from edgex.errors import EdgexError
    from edgex.in_situ import run_pipeline

    npz = base["voice"]
    places = [p for p in PLACE.split(",") if not p.startswith("voice=")]
    report = run_pipeline([base["folder"]], places, frames=FRAMES, stream_frames=FRAMES, voice=npz)
    official = report["official_utterance"]
    assert official["variant"] == "base" and official["voice_prompt"] == "in-context"
    assert official["codes_equal"] and official["frames_compared"] == FRAMES
    # the exported encoders the folder holds make the voice in situ, from reference audio
    clone = report["voice_clone"]
    assert clone["mode"] == "in-context" and clone["reference_frames"] == REFERENCE_FRAMES
    assert clone["speaker_embedding_db"] > 60 and clone["reference_codes_equal"]
    assert clone["utterance"]["codes_equal"] and clone["utterance"]["frames_compared"] == FRAMES
    assert report["verdict"] == "pass", report["failures"]

    broken = tmp_path / "broken.npz"
    np.savez(broken, speaker_embedding=np.zeros(3, np.float32))
    with pytest.raises(EdgexError, match="speaker embedding has 3 values"):
        run_pipeline([base["folder"]], places, frames=FRAMES, stream_frames=FRAMES, voice=broken)


@pytest.mark.builds_afresh
def test_broken_voice_graphs_fail_their_gates(monkeypatch, tmp_path):
    """The tiny preset's voice graphs, each broken as a port might break it: the speaker encoder fed its
    mel bins in reverse order, the speech encoder's second and third codebooks swapped."""
    from typer.testing import CliRunner

    from edgex.cli import app
    from edgex.recipes.qwen3_tts import voice

    speaker, speech = voice.SpeakerEncoder.forward, voice.SpeechEncoder.forward
    monkeypatch.setattr(voice.SpeakerEncoder, "forward", lambda self, mels: speaker(self, mels.flip(-1)))

    def swapped(self, wav):
        codes, latent = speech(self, wav)
        return codes[:, [0, 2, 1, *range(3, codes.shape[1])]], latent

    monkeypatch.setattr(voice.SpeechEncoder, "forward", swapped)
    result = CliRunner().invoke(app, ["export", "qwen3-tts", "--preset", "tiny", "-c", "speaker_encoder", "-c", "speech_encoder",
                                      "-f", "onnx", "-p", "fp32", "--set", "reference_frames=8", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.output[-3000:]
    entries = {e["component"]: e for e in json.loads(result.stdout)["artifacts"]}
    assert entries["speaker_encoder"]["verdict"] == "fail"
    assert entries["speech_encoder"]["verdict"] == "fail" and any("codes position" in f for f in entries["speech_encoder"]["parity"]["failures"])


def test_a_request_file_with_text_runs_against_the_official_generate(base, tmp_path):
    """`edgex pipeline --request FILE`: text through the checkpoint's tokenizer, the voice prompt file,
    non-streaming; a speaker a Base checkpoint lacks is a one-line error."""
    from edgex.recipes.qwen3_tts import runner as rn

    request = tmp_path / "request.json"
    request.write_text(json.dumps({"text": "hello world again", "voice": str(base["voice"]), "non_streaming": True}))
    places = ",".join(p for p in PLACE.split(",") if not p.startswith("voice="))
    proc = cli_here("pipeline", "qwen3-tts", str(base["folder"]), "--placement", places, "--frames", str(FRAMES),
                   "--stream-frames", str(FRAMES), "--request", str(request), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    official = json.loads(proc.stdout)["official_utterance"]
    assert official["text_ids"] == rn.chat_ids([1, 2, 3]).tolist()
    assert official["non_streaming"] and official["voice_prompt"] == "in-context" and official["codes_equal"]

    request.write_text(json.dumps({"text_ids": [1, 2], "speaker": "vivian"}))
    bad = run_cli("pipeline", "qwen3-tts", str(base["folder"]), "--placement", places, "--frames", "2", "--request", str(request))
    assert bad.returncode == 2 and "speaker 'vivian'" in bad.stderr and "Traceback" not in bad.stderr


def _reverse_mel_bins(folder: Path) -> None:
    """Rewrite `folder`'s speaker_encoder ONNX graph so it reads its mel bins in reverse order (a
    plausible porting slip), its manifest entry's hash updated and its verdict left `pass`: an
    artifact only the composed pipeline can catch."""
    import onnx
    from onnx import helper, numpy_helper

    from edgex.artifacts.files import sha256
    from edgex.verify import find_manifest

    manifest_path = find_manifest(folder)
    manifest = json.loads(manifest_path.read_text())
    entry = next(e for e in manifest["artifacts"] if e["component"] == "speaker_encoder")
    path = folder / entry["files"][0]["path"]
    model = onnx.load(str(path))
    graph = model.graph
    name = graph.input[0].name
    for node in graph.node:
        node.input[:] = [f"{name}_reversed" if i == name else i for i in node.input]
    constants = {"rev_starts": [-1], "rev_ends": [-(2**62)], "rev_axes": [-1], "rev_steps": [-1]}
    graph.initializer.extend(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in constants.items())
    graph.node.insert(0, helper.make_node("Slice", [name, *constants], [f"{name}_reversed"]))
    onnx.save(model, str(path))  # the weights inline: the .onnx.data beside it is left as it was
    entry["files"][0].update(sha256=sha256(path), bytes=path.stat().st_size)
    assert entry["verdict"] == "pass"
    manifest_path.write_text(json.dumps(manifest, indent=1))


def test_a_broken_speaker_encoder_artifact_fails_the_pipeline_voice_clone(base, tmp_path):
    """`edgex pipeline` composes the exported voice-prompt encoders it finds: a speaker_encoder artifact
    that reads its mel bins reversed (its manifest verdict still `pass`) makes another voice: the
    pipeline fails on the speaker embedding, and the utterance no longer equals the official one."""
    import shutil

    from edgex.in_situ import run_pipeline

    folder = Path(shutil.copytree(base["folder"], tmp_path / "cpu"))
    _reverse_mel_bins(folder)
    places = [p for p in PLACE.split(",") if not p.startswith("voice=")]
    report = run_pipeline([folder], places, frames=FRAMES, stream_frames=FRAMES)
    clone = report["voice_clone"]
    assert clone["mode"] == "in-context" and clone["reference_codes_equal"]
    assert clone["speaker_embedding_db"] < 20 and not clone["utterance"]["codes_equal"]
    assert "speaker_encoder" in {a["component"] for a in report["artifacts"]}
    assert report["verdict"] == "fail"
    assert any(f.startswith("voice clone: the speaker embedding") for f in report["failures"])
    assert not any(f.startswith("official utterance") for f in report["failures"])
