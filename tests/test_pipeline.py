"""In-situ parity (`edgex pipeline`): exported artifacts composed into the model's pipeline against
the eager pipeline, same seed and noise.

Qwen3-TTS reuses the README-demo export (`cpu_export`, its ONNX fp32 artifacts): a clean run passes,
a predictor artifact with corrupted weights (hashes rewritten, as a broken export would record
them) fails the pipeline, and an artifact that differs from its manifest is refused before anything
runs. Spark-X2.5's runner is exercised in-process on its graphs, with a decode graph whose logits
are perturbed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import cli_here, run_cli
from edgex.artifacts.files import sha256
from edgex.parity.runtimes.base import Session

pytestmark = pytest.mark.xdist_group("cpu_export")  # shares the README-demo export with its worker

PLACE = "talker=onnx:fp32,predictor=onnx:fp32,decoder=onnx:fp32"
FRAMES = ("--frames", "8", "--stream-frames", "8")


def _copy(cpu_export, dest: Path) -> Path:
    out, proc = cpu_export
    assert proc.returncode == 0, proc.stderr[-2000:]
    return Path(shutil.copytree(out / "qwen3-tts" / "cpu", dest))


@pytest.fixture(scope="module")
def clean(cpu_export, tmp_path_factory):
    folder = _copy(cpu_export, tmp_path_factory.mktemp("pipeline") / "cpu")
    return folder, cli_here("pipeline", "qwen3-tts", str(folder), "--placement", PLACE, *FRAMES, "--json")


def test_qwen3_tts_pipeline_of_fp32_artifacts_matches_the_eager_pipeline(clean):
    folder, proc = clean
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["verdict"] == "pass" and not report["failures"]
    tf, fr = report["teacher_forced"], report["free_running"]
    figures = (tf["talker_prefill"]["logits_db"], tf["talker_decode"]["logits_db_min"], tf["code_predictor"]["logits_db_min"],
               tf["decoder"]["wav_spectral_db"], tf["decoder"]["wav_db"])
    assert min(map(float, figures)) > 60  # strict JSON: an exact figure is the string "inf"
    assert fr["codes_agreement"] == 1.0 and fr["first_divergence"] is None and float(fr["audio_db"]) > 60
    assert float(fr["audio_agreed_frames_spectral_db"]) > 60 and float(report["official_utterance"]["wav_spectral_db"]) > 60
    sampled = report["sampled_utterance"]  # the frame graph serves the predictor: only the talker samples
    assert sampled["gated"] and not sampled["predictor_sampling"] and "predictor_note" in sampled
    assert sampled["codes_equal"] and sampled["frames_compared"] == sampled["official_frames"] > 0, sampled
    streaming = {k: v for k, v in report["streaming"].items() if k != "note"}
    assert len(streaming) == 4 and all(float(v["db"]) > 60 and v["ttfa_ms"] > 0 for v in streaming.values())
    assert [v["chunks"][0] for k, v in streaming.items() if k.startswith(("1 then 25", "ramp"))] == [1, 2]
    timing = report["timing"]
    assert set(timing["eager_over_artifact"]) == {"talker_prefill", "talker_decode", "code_predictor", "code2latent", "latent2wav"}
    assert timing["artifact_rtf"] > 0 and timing["eager_rtf"] > 0
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["pipeline"]["sha256"] == sha256(folder / "pipeline.json") and manifest["pipeline"]["verdict"] == "pass"
    recorded = {(e["component"], f["path"]): f["sha256"] for e in manifest["artifacts"] for f in e["files"]}
    assert all(recorded[a["component"], f["path"]] == f["sha256"] for a in report["artifacts"] for f in a["files"])


def _corrupt_largest_initializer(model: Path) -> None:
    """Scale the middle half of the largest external float initializer by -4, located by onnx's reader."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    spans = []
    for init in graph.initializer:
        info = {e.key: e.value for e in init.external_data}
        if init.data_location == onnx.TensorProto.EXTERNAL and init.data_type == onnx.TensorProto.FLOAT:
            spans.append((int(info["length"]), int(info.get("offset", 0)), info["location"]))
    length, offset, location = max(spans)
    with open(model.parent / location, "r+b") as f:
        f.seek(offset + length // 4 // 4 * 4)
        values = np.frombuffer(f.read(length // 2 // 4 * 4), np.float32)
        f.seek(offset + length // 4 // 4 * 4)
        f.write((values * -4.0).astype(np.float32).tobytes())


def test_a_broken_predictor_artifact_fails_the_pipeline(cpu_export, clean, tmp_path):
    folder = _copy(cpu_export, tmp_path / "cpu")
    (folder / "pipeline.json").unlink(missing_ok=True)
    _corrupt_largest_initializer(folder / "code_predictor.fp32.onnx")
    refused = cli_here("pipeline", "qwen3-tts", str(folder), "--placement", PLACE, *FRAMES)
    assert refused.returncode == 2 and "code_predictor" in refused.stderr and "sha256" in refused.stderr
    assert "Traceback" not in refused.stderr
    manifest = json.loads((folder / "manifest.json").read_text())
    for entry in manifest["artifacts"]:  # what a broken export would have recorded
        for record in entry["files"]:
            record.update(sha256=sha256(folder / record["path"]), bytes=(folder / record["path"]).stat().st_size)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    proc = cli_here("pipeline", "qwen3-tts", str(folder), "--placement", PLACE, *FRAMES, "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["verdict"] == "fail"
    assert any(f.startswith("teacher-forced code_predictor") for f in report["failures"])
    assert report["free_running"]["codes_agreement"] < 1.0
    assert json.loads((folder / "manifest.json").read_text())["pipeline"]["verdict"] == "fail"


def test_a_broken_decoder_artifact_fails_the_pipeline_on_its_spectral_figure(cpu_export, clean, tmp_path):
    """The decoder's waveform is judged by its spectral figure (the recipe declares it), its SNR
    beside it: latent2wav with corrupted weights fails teacher-forced, free-running and official."""
    folder = _copy(cpu_export, tmp_path / "cpu")
    (folder / "pipeline.json").unlink(missing_ok=True)
    _corrupt_largest_initializer(folder / "latent2wav.fp32.onnx")
    manifest = json.loads((folder / "manifest.json").read_text())
    for entry in manifest["artifacts"]:  # what a broken export would have recorded
        for record in entry["files"]:
            record.update(sha256=sha256(folder / record["path"]), bytes=(folder / record["path"]).stat().st_size)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    proc = cli_here("pipeline", "qwen3-tts", str(folder), "--placement", PLACE, *FRAMES, "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    decoder = report["teacher_forced"]["decoder"]
    assert report["verdict"] == "fail" and float(decoder["wav_spectral_db"]) < 60 and "wav_db" in decoder
    assert any(f.startswith("teacher-forced decoder (code2latent + latent2wav) spectral figure") for f in report["failures"])
    assert any(f.startswith("free-running audio") and "spectral figure" in f for f in report["failures"])
    assert report["free_running"]["codes_agreement"] == 1.0  # the codes are the talker's and predictor's: untouched
    print(f"broken latent2wav: spectral {float(decoder['wav_spectral_db']):.1f} dB, waveform SNR {float(decoder['wav_db']):.1f} dB; "
          f"faithful: spectral {float(json.loads(clean[1].stdout)['teacher_forced']['decoder']['wav_spectral_db']):.1f} dB")


def test_spark_runner_in_situ_and_a_perturbed_decode_graph():
    from edgex.in_situ import Stage
    from edgex.parity.check import tie_margin
    from edgex.recipes import RECIPES
    from edgex.recipes.spark_x25.runner import numpy_callable

    recipe = RECIPES.get("spark-x2.5")
    loaded = recipe.load("tiny", None, 0)
    components = {c.name: c for c in recipe.components(loaded)}

    class Graph:  # the export wrappers stand in for artifacts: the runner and the scoring are under test
        def __init__(self, module, noise=0.0, scale=1.0):
            self.run_module, self.noise, self.scale = numpy_callable(module), noise, scale

        def run(self, inputs):
            outputs = self.run_module(inputs)
            outputs[0] = self.scale * outputs[0] + self.noise * np.random.default_rng(0).standard_normal(outputs[0].shape).astype(np.float32)
            return outputs

    def stages(noise, scale=1.0, gate=60.0):
        return {n: Stage(n, {"io_float_dtype": "float32"}, Graph(components[n].module, *((noise, scale) if n == "decode" else ())),
                         gate if n == "decode" else 60.0)
                for n in ("prefill", "decode")}

    settings = {"frames": 12, "stream_frames": None}
    good = recipe.in_situ(loaded, stages(0.0), settings, lambda _m: None)
    assert not good["failures"] and good["free_running"]["token_agreement"] == 1.0
    assert good["teacher_forced"]["decode"]["logits_db_min_position"] > 60
    bad = recipe.in_situ(loaded, stages(1.0), settings, lambda _m: None)
    assert any(f.startswith("teacher-forced decode") for f in bad["failures"])
    # A decode graph whose logits are 1.3x too large scores 10.5 dB: it passes a quantized 10 dB gate
    # and samples another token at step 2 with an eager margin of 0.22, inside that gate's tie margin
    # (0.50) but not inside the in-situ one (the 30 dB lowering level, 0.05): the pipeline fails.
    hot = recipe.in_situ(loaded, stages(0.0, scale=1.3, gate=10.0), settings, lambda _m: None)
    assert hot["teacher_forced"]["decode"]["logits_db_min_position"] > 10
    divergence = hot["free_running"]["first_divergence"]
    assert divergence["tie_db"] == 30.0 and not divergence["tie"]
    assert divergence["tie_margin"] < divergence["margin"] < tie_margin(10.0, np.ones(1)) * divergence["tie_margin"] / tie_margin(30.0, np.ones(1))
    assert any(f.startswith("free-running: step") for f in hot["failures"])


def test_spark_free_running_logits_over_the_agreed_steps_are_gated():
    """A decode artifact whose logits drift only on its own history (a state bug teacher forcing does
    not reach: here noise from the free-running pass's first call on, too small to flip a token)
    samples the eager tokens and still fails: the agreed steps' logits are held to the decode gate."""
    from edgex.in_situ import Stage
    from edgex.recipes import RECIPES
    from edgex.recipes.spark_x25.runner import numpy_callable

    recipe = RECIPES.get("spark-x2.5")
    loaded = recipe.load("tiny", None, 0)
    components = {c.name: c for c in recipe.components(loaded)}

    class Drifting:
        def __init__(self, module, after):
            self.run_module, self.after, self.calls = numpy_callable(module), after, 0

        def run(self, inputs):
            outputs = self.run_module(inputs)
            self.calls += 1
            if self.calls > self.after:
                rng = np.random.default_rng(self.calls)
                outputs[0] = outputs[0] + 1e-2 * np.abs(outputs[0]).mean() * rng.standard_normal(outputs[0].shape).astype(np.float32)
            return outputs

    settings = {"frames": 8, "stream_frames": None}
    forced_calls = 3 + 8 - 1  # the teacher-forced pass: the prompt's extra tokens, then the steps after the first
    stages = {"prefill": Stage("prefill", {"io_float_dtype": "float32"}, Drifting(components["prefill"].module, 10**9), 60.0),
              "decode": Stage("decode", {"io_float_dtype": "float32"}, Drifting(components["decode"].module, forced_calls), 60.0)}
    report = recipe.in_situ(loaded, stages, settings, lambda _m: None)
    assert report["teacher_forced"]["decode"]["logits_db_min_position"] > 60
    assert report["free_running"]["token_agreement"] == 1.0
    assert any(f.startswith("free-running logits over the 8 agreed steps") for f in report["failures"]), report["failures"]


def test_the_predictor_stage_is_the_frame_graph_or_the_step_graph_a_placement_names(tmp_path):
    """A manifest with both predictor graphs (as the README demo's): the role's placement serves the
    frame graph, a placement naming `code_predictor_step` the step graph (the runner loops it), the
    last named when both are; neither exported: one error naming both."""
    from edgex.errors import EdgexError
    from edgex.in_situ import _choose
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    entries = [{"component": c, "exporter": "onnx", "precision": "fp32", "files": [{"path": f"{c}.fp32.onnx"}], "verdict": "pass"}
               for c in recipe.facts.components]
    manifests = [(tmp_path, {"target": "cpu", "artifacts": entries})]
    stages = list(recipe.in_situ_components)
    frame = _choose(manifests, recipe.facts, stages, PLACE.split(","))
    assert "code_predictor" in frame and "code_predictor_step" not in frame
    step = _choose(manifests, recipe.facts, stages, [*PLACE.split(","), "code_predictor_step=onnx:fp32"])
    assert step["code_predictor_step"][1]["component"] == "code_predictor_step" and "code_predictor" not in step
    both = [*PLACE.split(","), "code_predictor_step=onnx:fp32", "code_predictor=onnx:fp32"]
    assert "code_predictor" in _choose(manifests, recipe.facts, stages, both), "the last one named serves"
    again = [*PLACE.split(","), "code_predictor_step=onnx:fp16", "code_predictor_step=onnx:fp32"]
    with pytest.raises(EdgexError, match="given twice"):  # one artifact serves a stage: never a silent pick
        _choose(manifests, recipe.facts, stages, again)
    with pytest.raises(EdgexError, match="needs code_predictor or code_predictor_step"):
        _choose(manifests, recipe.facts, stages, [*PLACE.split(","), "code_predictor_step=onnx:fp16", "code_predictor=onnx:fp16"])


def test_without_a_placement_each_stage_is_the_default_plans_artifact(tmp_path):
    """The README demo's folder, no --placement: the target's first format serves each stage; where
    that format builds a component by no default (ExecuTorch leaves the unrolled predictor frame to
    the runner's loop over the step graph), the stage's other option serves, never an IndexError."""
    from edgex.in_situ import _choose
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    entries = [{"component": c, "exporter": e, "precision": p, "files": [{"path": f"{c}.{p}.{e}"}], "verdict": "pass"}
               for c in recipe.facts.components for e in ("executorch", "onnx") for p in ("fp32", "fp16")
               if not (c == "code_predictor" and e == "executorch")]
    chosen = _choose([(tmp_path, {"target": "cpu", "artifacts": entries})], recipe.facts, list(recipe.in_situ_components), [])
    assert "code_predictor" not in chosen and chosen["code_predictor_step"][1]["exporter"] == "executorch"
    assert {e["exporter"] for _, e in chosen.values()} == {"executorch"}
    assert {e["precision"] for _, e in chosen.values()} == {"fp32"}


def test_the_decoder_stage_is_the_pair_else_code2wavs_window(tmp_path):
    """The decoder stage: the streaming pair where the folders hold both at the placement, else the
    windowed `code2wav` (the llama-cpp target's default folder: libmtmd's Code2Wav); neither held:
    one error naming both; the sweep ranks the alternative it holds whole."""
    from edgex.errors import EdgexError
    from edgex.in_situ import _choose
    from edgex.recipes import RECIPES
    from edgex.sweep.recommend import swept_stages

    recipe = RECIPES.get("qwen3-tts")
    stages = list(recipe.in_situ_components)

    def entry(component, exporter, precision):
        return {"component": component, "exporter": exporter, "precision": precision, "verdict": "pass",
                "files": [{"path": f"{component}.{precision}.{exporter}"}]}

    gguf = [entry("talker_prefill", "gguf", "f16"), entry("talker_decode", "gguf", "f16"),
            entry("code_predictor", "gguf", "f32"), entry("code2wav", "gguf", "f32")]
    chosen = _choose([(tmp_path, {"target": "llama-cpp", "artifacts": gguf})], recipe.facts, stages, [])
    assert set(chosen) == {"talker_prefill", "talker_decode", "code_predictor", "code2wav"}
    onnx = [entry(c, "onnx", "fp32") for c in ("code2latent", "latent2wav", "code2wav")]
    both = [(tmp_path, {"target": "llama-cpp", "artifacts": gguf}), (tmp_path / "cpu", {"target": "cpu", "artifacts": onnx})]
    pair = _choose(both, recipe.facts, stages, ["code2latent=onnx:fp32", "latent2wav=onnx:fp32"])
    assert "code2wav" not in pair and pair["code2latent"][0] == tmp_path / "cpu" == pair["latent2wav"][0]
    with pytest.raises(EdgexError, match="needs code2latent \\+ latent2wav or code2wav: no gguf f32 code2latent"):
        _choose([(tmp_path, {"target": "llama-cpp", "artifacts": gguf[:3]})], recipe.facts, stages, [])
    assert swept_stages(stages, {"code2latent", "latent2wav", "code2wav"})[-2:] == [("code2latent",), ("latent2wav",)]
    assert swept_stages(stages, {"code2wav", "talker_decode"})[-1] == ("code2wav",)


def test_the_noise_fed_passes_refuse_code2wavs_window_in_one_line():
    """A predictor that takes the eager pipeline's noise runs the teacher-forced, free-running and
    streaming passes, which decode with the exact pair: Code2Wav's window alone is refused before
    anything runs, in one line naming the pair."""
    from types import SimpleNamespace

    from edgex.errors import EdgexError
    from edgex.in_situ import Stage
    from edgex.recipes.qwen3_tts.in_situ import in_situ

    class TakesNoise(Session):  # a graph that samples from its noise input (ONNX, .pte ...)
        def run(self, inputs):
            raise AssertionError("nothing runs")

    stages = {n: Stage(n, {}, TakesNoise(), 30.0) for n in ("talker_prefill", "talker_decode", "code_predictor", "code2wav")}
    loaded = SimpleNamespace(models=None, options={"max_context": 64, "prefill_len": 8, "seed": 0})
    with pytest.raises(EdgexError, match="decode with the exact streaming pair.*place code2latent and latent2wav"):
        in_situ(loaded, stages, {"frames": 4}, lambda _m: None)


def test_only_artifacts_that_passed_their_gates_serve_a_stage(tmp_path):
    """A stage is never served by a failed or unverified artifact: the picker takes a passing one of
    the placed scheme (here the calibration the placement names), else refuses in one line with the
    verdict, so no pipeline verdict rests on an artifact that failed its own gate."""
    from edgex.errors import EdgexError
    from edgex.in_situ import _choose
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")

    def entry(component, verdict="pass", calibration=None):
        return {"component": component, "exporter": "onnx", "precision": "fp32", "verdict": verdict,
                "files": [{"path": f"{component}.onnx"}], "export_options": {"calibration_size": calibration} if calibration else {}}

    stages = list(recipe.in_situ_components)
    good = [entry(c) for c in recipe.facts.components if c != "talker_decode"]
    failed = [(tmp_path / "a", {"target": "cpu", "artifacts": [*good, entry("talker_decode", "fail")]})]
    with pytest.raises(EdgexError, match="the onnx fp32 talker_decode artifact did not pass its gate \\(verdict fail\\)"):
        _choose(failed, recipe.facts, stages, PLACE.split(","))
    unverified = [(tmp_path / "a", {"target": "cpu", "artifacts": [*good, entry("talker_decode", "unverified")]})]
    with pytest.raises(EdgexError, match="verdict unverified"):
        _choose(unverified, recipe.facts, stages, PLACE.split(","))
    # a later folder's passing artifact of the same scheme serves where the first folder's failed
    either = [*failed, (tmp_path / "b", {"target": "cpu", "artifacts": [entry("talker_decode")]})]
    assert _choose(either, recipe.facts, stages, PLACE.split(","))["talker_decode"][0] == tmp_path / "b"


class _WrapperGraph(Session):
    """An export wrapper standing in for an artifact, with seeded noise on its first output (logits
    for the LM graphs; the frame graph's first output is its codes)."""

    def __init__(self, module, noise=0.0):
        self.module, self.noise = module.eval(), noise

    def run(self, inputs):
        import torch

        with torch.no_grad():
            outputs = [t.numpy() for t in self.module(*[torch.from_numpy(np.ascontiguousarray(x)) for x in inputs])]
        if self.noise:
            outputs[0] = outputs[0] + self.noise * np.random.default_rng(0).standard_normal(outputs[0].shape).astype(np.float32)
        return outputs


def _wrappers(loaded, predictor_stage: str) -> dict:
    """The export wrappers standing in for each stage's artifact; the predictor stage is the frame
    graph (`code_predictor`) or the step graph the runner loops (`code_predictor_step`)."""
    from edgex.recipes.qwen3_tts import code2wav, predictor, talker

    model, decoder = loaded.models.talker, loaded.models.decoder
    frame = predictor.CodePredictorFrame if predictor_stage == "code_predictor" else predictor.CodePredictorStep
    options = loaded.options
    return {"talker_prefill": talker.TalkerPrefill(model, options["prefill_len"]),
            "talker_decode": talker.TalkerDecode(model, options["max_context"]),
            predictor_stage: frame(model), "code2latent": code2wav.Code2Latent(decoder),
            "latent2wav": code2wav.Latent2Wav(decoder, code2wav.receptive_field_frames(decoder))}


def _stage_specs(loaded) -> dict:
    """The input shapes each stage's manifest entry declares (the runner sizes its state from them)."""
    from edgex.recipes.qwen3_tts import code2wav, predictor

    model, decoder = loaded.models.talker, loaded.models.decoder
    config = model.code_predictor.config
    past = [config.num_hidden_layers, 1, config.num_key_value_heads, predictor.GROUPS, config.head_dim]  # the manifest's spec
    tcfg, dcfg, options = model.config, decoder.config, loaded.options
    window = [dcfg.num_hidden_layers, 1, dcfg.num_key_value_heads, dcfg.sliding_window - 1, dcfg.head_dim]
    return {
        "talker_prefill": {"inputs_embeds": [1, options["prefill_len"], tcfg.hidden_size]},
        "talker_decode": {"past_key": [tcfg.num_hidden_layers, 1, tcfg.num_key_value_heads, options["max_context"], tcfg.head_dim]},
        "code_predictor_step": {"past_key": past},
        "code2latent": {"codes": [1, 16, 25], "conv_state": [1, dcfg.codebook_dim, 2], "past_key": window},
        "latent2wav": {"latent": [1, dcfg.latent_dim, code2wav.receptive_field_frames(decoder) + 25]},
    }


def _entry(specs: dict, name: str) -> dict:
    return {"io_float_dtype": "float32", "inputs": [{"name": k, "shape": v} for k, v in specs.get(name, {}).items()]}


def test_frame_one_scores_talker_decode_and_a_frame_zero_code_is_judged_on_the_prefill():
    """`--frames 1` scores the talker's decode (the call after the last frame), so a broken decode
    graph fails a one-frame pipeline; a code-0 divergence at frame 0 comes from the prefill's logits
    and is judged at the prefill stage's tie level, not the decode's."""

    from edgex.in_situ import Stage
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    loaded = recipe.load("tiny", None, 0)
    modules = _wrappers(loaded, "code_predictor")

    specs = _stage_specs(loaded)

    def stages(noisy: str, noise: float, gates=None):
        return {n: Stage(n, _entry(specs, n), _WrapperGraph(m, noise if n == noisy else 0.0), (gates or {}).get(n, 60.0))
                for n, m in modules.items()}

    settings = {"frames": 1, "stream_frames": 1}
    good = recipe.in_situ(loaded, stages("talker_decode", 0.0), settings, lambda _m: None)
    assert not good["failures"] and float(good["teacher_forced"]["talker_decode"]["logits_db_min"]) > 60
    bad = recipe.in_situ(loaded, stages("talker_decode", 1.0), settings, lambda _m: None)
    assert any(f.startswith("teacher-forced talker_decode") for f in bad["failures"]), bad["failures"]
    hot = recipe.in_situ(loaded, stages("talker_prefill", 10.0, {"talker_decode": 45.0}), settings, lambda _m: None)
    divergence = hot["free_running"]["first_divergence"]
    assert (divergence["frame"], divergence["codebook"], divergence["stage"]) == (0, 0, "talker_prefill")
    assert divergence["tie_db"] == 60.0, "the prefill's tie level, not the decode's 45 dB"


def test_the_step_graph_looped_by_the_runner_and_a_perturbed_step_graph():
    """`code_predictor_step` driven 16 calls a frame (`_StepLoop`), the export wrappers standing in
    for artifacts: the pipeline matches the eager one; with noise on the step graph's logits the
    teacher-forced predictor stage fails its gate and the free-running codes drift."""

    from edgex.in_situ import Stage
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    loaded = recipe.load("tiny", None, 0)
    modules = _wrappers(loaded, "code_predictor_step")
    specs = _stage_specs(loaded)

    def stages(noise):
        return {n: Stage(n, _entry(specs, n), _WrapperGraph(m, noise if n == "code_predictor_step" else 0.0), 60.0) for n, m in modules.items()}

    settings = {"frames": 4, "stream_frames": 4}
    good = recipe.in_situ(loaded, stages(0.0), settings, lambda _m: None)
    assert not good["failures"], good["failures"]
    predicted = good["teacher_forced"]["code_predictor"]
    assert predicted["component"] == "code_predictor_step" and float(predicted["logits_db_min"]) > 60
    assert good["free_running"]["codes_agreement"] == 1.0 and good["timing"]["predictor_step_call_ms"] > 0
    bad = recipe.in_situ(loaded, stages(1.0), settings, lambda _m: None)
    assert any(f.startswith("teacher-forced code_predictor_step") for f in bad["failures"])
    assert any("not a near-tie of the eager scores" in f for f in bad["failures"]), "its own flips on the eager history"
    assert bad["free_running"]["codes_agreement"] < 1.0
    assert not good["teacher_forced"]["code_predictor"]["flips"]


@pytest.mark.benchmark
def test_benchmark_0_6b_runner_on_cpu(tmp_path):
    """The host runner's TTFA / RTF table at full size (heavy: the 0.6b ONNX exports need ~10+ GB and
    many minutes; excluded from the suite). Prints the pipeline report's timing block."""
    export = run_cli("export", "qwen3-tts", "--target", "cpu", "--preset", "0.6b", "-f", "onnx", "-p", "fp32", "-c",
                     "talker_prefill,talker_decode,code_predictor,code2latent,latent2wav", "--out", str(tmp_path), "--json")
    assert export.returncode == 0, export.stderr[-2000:]
    proc = run_cli("pipeline", "qwen3-tts", str(tmp_path / "qwen3-tts" / "cpu"), "--placement", PLACE, "--frames", "50", "--json")
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    print(json.dumps(json.loads(proc.stdout)["timing"], indent=2))


def test_a_fixed_window_code2wav_is_refused_for_the_windowed_decode_in_one_line():
    """The windowed decode feeds shorter windows first: a code2wav file with a fixed window (ONNX,
    .pte) is refused in one line naming the pair to place, not run into a runtime's shape error."""
    from types import SimpleNamespace

    from edgex.errors import EdgexError
    from edgex.recipes.qwen3_tts.utterance import streaming_decoder

    window = {"context_frames": 72, "new_frames": 25}
    held = SimpleNamespace(entry={"exporter": "gguf", "metadata": window})
    assert streaming_decoder({"code2wav": held}).context == 72
    with pytest.raises(EdgexError, match="the onnx code2wav takes a fixed window: place the code2latent \\+ latent2wav pair"):
        streaming_decoder({"code2wav": SimpleNamespace(entry={"exporter": "onnx", "metadata": window})})
