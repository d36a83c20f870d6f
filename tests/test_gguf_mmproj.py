"""Qwen3-TTS's mmproj GGUF (code predictor + Code2Wav + speaker encoder) as llama.cpp's converter
writes it, run by libmtmd through `llama_cpp.mtmd_cpp`; a planted bug in the file fails its gate."""

import dataclasses
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from edgex.errors import EdgexError
from edgex.plan import make_plan

pytestmark = pytest.mark.xdist_group("gguf")
llama_cpp = pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def mmproj_components(tiny):
    return tiny[1]


def _export(component, tmp_path, precision="f32", tensors=None):
    """The component's mmproj written by the GGUF exporter; `tensors` edits the layout's tensors."""
    from edgex.exporters.gguf import GgufExporter

    layout = original = component.layouts["gguf"]
    if tensors is not None:
        layout = dataclasses.replace(original, tensors=lambda: tensors(original.tensors()))
    planted = dataclasses.replace(component, layouts={"gguf": layout})
    dest = tmp_path / f"{component.name}.{precision}.gguf"
    GgufExporter().export(planted, precision, dest)
    return dest


def _gate(component, path, precision="f32"):
    from edgex.parity.check import measure
    from edgex.parity.gates import threshold_db
    from edgex.parity.runtimes.llamacpp import LlamaCppRuntime

    session = LlamaCppRuntime().load([path])
    try:
        return measure(component, session, "llamacpp", "float32", threshold_db(component.role, precision))
    finally:
        session.close()


def test_libmtmd_runs_the_predictor_and_its_codes_logits_and_embedding_pass(mmproj_components, tmp_path):
    """libmtmd's greedy frame: codes equal to eager's, the heads' logits read from its graph; the
    sampled sample is not run (libmtmd draws its own samples), with the reason."""
    component = mmproj_components["code_predictor"]
    report = _gate(component, _export(component, tmp_path))
    assert report.verdict == "pass", report.failures
    assert report.min_token_agreement == 1.0 and report.min_snr_db > 100
    run = {s: v for s, v in report.samples.items() if "not_run" not in v}
    assert set(run) == {"utterance_a_frame10_greedy", "utterance_b_frame31_greedy"}
    assert "libmtmd samples inside its graph" in report.samples["utterance_b_frame30_sampled"]["not_run"]


def test_a_component_none_of_whose_samples_the_runtime_takes_fails(mmproj_components, tmp_path):
    component = mmproj_components["code_predictor"]
    sampled = dataclasses.replace(component, samples={k: v for k, v in component.samples.items() if "sampled" in k})
    report = _gate(sampled, _export(component, tmp_path))
    assert report.verdict == "fail" and any("runs none of its samples" in f for f in report.failures), report.failures


def test_the_pipeline_runs_libmtmds_predictor_greedy(mmproj_components, tmp_path):
    """The in-situ passes that feed the eager pipeline's noise cannot run on libmtmd's predictor: the
    pipeline knows it before anything runs and takes its greedy path (`greedy_in_situ`)."""
    from edgex.in_situ import Stage
    from edgex.parity.runtimes.llamacpp import LlamaCppRuntime
    from edgex.recipes.qwen3_tts.in_situ import draws_own_samples

    session = LlamaCppRuntime().load([_export(mmproj_components["code_predictor"], tmp_path)])
    stage = Stage("code_predictor", {"format": "gguf", "precision": "f32"}, session, 45.0)
    assert "libmtmd samples inside its graph" in draws_own_samples({"code_predictor": stage})
    session.close()

    from edgex.parity.runtimes.base import Session

    class TakesNoise(Session):  # a graph that samples from its noise input (ONNX, .pte ...)
        def run(self, inputs):
            raise AssertionError("the probe runs nothing")

    assert draws_own_samples({"code_predictor": Stage("code_predictor", {}, TakesNoise(), 30.0)}) is None


def test_swapped_codebook_rows_in_the_mmproj_fail_the_predictor(mmproj_components, tmp_path):
    """Two rows of codebook 3's embedding swapped: the rows of the code eager picks there on a greedy
    sample and another; libmtmd's later codes follow the wrong embedding and flip beyond ties."""
    component = mmproj_components["code_predictor"]
    sample = component.samples["utterance_a_frame10_greedy"]
    codes = component.eager(sample, None)[0].numpy().reshape(-1)
    row, other = int(codes[3]), (int(codes[3]) + 1) % 2048

    def swap(tensors):
        table = tensors["a.gen.code.embd.weight"].copy()
        table[3, [row, other]] = table[3, [other, row]]
        return {**tensors, "a.gen.code.embd.weight": table}

    report = _gate(component, _export(component, tmp_path, tensors=swap))
    assert report.verdict == "fail"
    assert any("margin" in f and "tie margin" in f for f in report.failures), report.failures


def _scaled_conv(tensors):
    """A planted Code2Wav bug: one decoder conv's kernel scaled by 1.5."""
    name = "a.gen.wav.dac.blk.1.res.0.conv1.weight"
    return {**tensors, name: tensors[name] * 1.5}


def test_libmtmd_code2wav_passes_and_a_scaled_conv_fails(mmproj_components, tmp_path):
    component = mmproj_components["code2wav"]
    faithful = _gate(component, _export(component, tmp_path))
    assert faithful.verdict == "pass", faithful.failures

    (tmp_path / "planted").mkdir()
    broken = _gate(component, _export(component, tmp_path / "planted", tensors=_scaled_conv))
    assert broken.verdict == "fail" and broken.min_snr_db < faithful.threshold_db - 10, broken.min_snr_db


@pytest.fixture(scope="module")
def llama_cpp_folder(mmproj_components, tmp_path_factory):
    """What `edgex export qwen3-tts --target llama-cpp --preset tiny` writes for the target's default
    pipeline: the suite's shared export's f16 talkers, and the mmproj's code_predictor and code2wav at
    f32, exported and gated as the export does (`_export_one`)."""
    from conftest import gguf_export, subset_folder
    from edgex.exporters import EXPORTERS
    from edgex.export import _export_one
    from edgex.plan import Job

    out, proc = gguf_export()
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path_factory.mktemp("llama-cpp")
    folder, manifest = subset_folder(out / "qwen3-tts" / "llama-cpp", lambda e: e["precision"] == "f16", folder)
    for name in ("code_predictor", "code2wav"):
        component = mmproj_components[name]
        job = Job(name, component.role, "gguf", "f32")
        manifest["artifacts"] += _export_one(job, component, EXPORTERS.get("gguf"), folder, {}, None, None)
    assert [e["verdict"] for e in manifest["artifacts"]] == ["pass"] * 4
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_the_llama_cpp_folder_runs_its_pipeline_on_its_own_code2wav(llama_cpp_folder, mmproj_components, tmp_path):
    """`edgex pipeline` on the llama-cpp folder alone: the talker at the target's default (f16),
    libmtmd's predictor greedy and libmtmd's Code2Wav window as the decoder (the folder holds no
    streaming pair), against the official generate(); the same folder with one Code2Wav conv scaled
    in its mmproj (the manifest vouching for the file) fails on the waveform, its codes still equal."""
    import shutil

    from edgex.artifacts.files import sha256
    from edgex.in_situ import run_pipeline

    folder = Path(shutil.copytree(llama_cpp_folder, tmp_path / "llama-cpp"))
    report = run_pipeline([folder], frames=12)
    assert report["verdict"] == "pass", report["failures"]
    assert {(a["component"], a["precision"]) for a in report["artifacts"]} == {
        ("talker_prefill", "f16"), ("talker_decode", "f16"), ("code_predictor", "f32"), ("code2wav", "f32")}
    official = report["official_utterance"]
    assert report["decoder"] == "code2wav" and official["codes_equal"] and official["frames_compared"] == 12
    faithful = float(official["wav_spectral_db"])
    assert faithful > 45, official

    planted = _export(mmproj_components["code2wav"], tmp_path, tensors=_scaled_conv)
    shutil.copyfile(planted, folder / "code2wav.f32.gguf")
    manifest = json.loads((folder / "manifest.json").read_text())
    entry = next(e for e in manifest["artifacts"] if e["component"] == "code2wav")
    entry["files"][0]["sha256"] = sha256(folder / "code2wav.f32.gguf")  # what a broken export would have recorded
    (folder / "manifest.json").write_text(json.dumps(manifest))
    broken = run_pipeline([folder], frames=12)
    official = broken["official_utterance"]
    assert broken["verdict"] == "fail" and official["codes_equal"] and float(official["wav_spectral_db"]) < faithful - 10
    assert any("waveform of the 12 agreed frames" in f and "below the decoder's 45.0 dB gate" in f for f in broken["failures"])


def test_the_mmproj_follows_llama_cpps_converter(mmproj_components, tmp_path):
    """Names, keys and forced types of llama.cpp's converter: a 3-D stacked table per predictor
    part, the speaker encoder present, conv kernels F16, transposed-conv kernels and ffn_down F32."""
    from gguf import GGUFReader

    reader = GGUFReader(str(_export(mmproj_components["code2wav"], tmp_path, "q8_0")))
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert fields["general.architecture"] == "clip" and fields["general.type"] == "mmproj"
    assert fields["clip.audio.projector_type"] == "qwen3tts_spkenc" and fields["clip.gen.audio.projector_type"] == "qwen3tts_gen"
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    shapes = {t.name: [int(n) for n in t.shape] for t in reader.tensors}
    assert shapes["a.gen.code.embd.weight"] == [64, 2048, 15] and shapes["a.gen.code.out_embd.weight"] == [64, 3072]
    assert types["a.gen.wav.pre_conv.weight"] == "F16" and types["a.gen.wav.dac.blk.0.conv.weight"] == "F32"
    assert types["a.gen.code.blk.0.ffn_down.weight"] == "F32" and types["a.gen.code.blk.0.attn_q.weight"] == "Q8_0"
    assert {"mm.a.fc.weight", "a.conv1d.0.weight", "a.blk.3.res2.6.weight"} <= set(types)


def _custom_voice(tmp_path):
    """A CustomVoice-like checkpoint: no speaker_encoder_config, no speaker_encoder.* tensors."""
    from edgex.recipes.qwen3_tts.presets import get_preset

    preset = get_preset("tiny")
    (tmp_path / "speech_tokenizer").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"talker_config": preset.talker}))
    (tmp_path / "speech_tokenizer" / "config.json").write_text(json.dumps({"decoder_config": preset.decoder}))
    header = json.dumps({"talker.model.norm.weight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    return tmp_path


def test_a_checkpoint_without_speaker_encoder_keeps_its_talker_and_says_why_at_plan_time(tmp_path):
    (tmp_path / "ckpt").mkdir()
    folder = _custom_voice(tmp_path / "ckpt")
    checked = make_plan("qwen3-tts", "llama-cpp", tmp_path / "out", checkpoint=str(folder))
    assert {j.component for j in checked.jobs} == {"talker_prefill", "talker_decode"}
    reasons = checked.target.facts["not_built"]
    assert "speaker encoder" in reasons["code_predictor"] and reasons["code2wav"] == reasons["code_predictor"]
    with pytest.raises(EdgexError, match="speaker encoder"):
        make_plan("qwen3-tts", "llama-cpp", tmp_path / "out", checkpoint=str(folder), components=["code2wav"])


def test_libmtmd_refuses_nothing_natively(tmp_path):
    """A GGUF that is not a Qwen3-TTS mmproj, and inputs out of range: Python errors, no abort."""
    from edgex.parity.runtimes.mtmd import check_mmproj

    import gguf

    path = tmp_path / "other.gguf"
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_string("general.type", "mmproj")
    writer.add_tensor("x", np.zeros((2, 2), np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file(), writer.close()
    with pytest.raises(RuntimeError, match="not a Qwen3-TTS generation mmproj"):
        check_mmproj(path)
