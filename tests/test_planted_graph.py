"""Bugs planted in the exported graph only (`planted_graph.py`) fail the gate at a precision a
target places by default for the component, and the same component unbroken passes there. The whole
matrix (every bug, every default format:precision) is benchmarks/bench_planted_graph.py; here a few
representative rows: a dropped attention head at Core ML w4 (the `apple` target's talker_decode)
and at QNN w8a16 (the Snapdragon targets' MiniCPM-o TTS head), and a SmolVLA Euler loop with one
step's velocity zeroed at MNN fp16 (the `mnn` target's action_loop). That the action error
(`gates.ACTION_ERROR`) fails a policy its SNRs pass is tests/test_task_figures.py's."""

from __future__ import annotations

import pytest
import torch

from edgex.export import gate_files, run_parity
from edgex.exporters import EXPORTERS
from edgex.recipes import RECIPES
from edgex.targets import get_target
from planted_graph import plant, plant_gguf

pytestmark = pytest.mark.xdist_group("planted_graph")
OPTIONS = {"qnn": get_target("s25-htp").exporter_options["qnn"]}


@pytest.fixture(scope="module")
def components():
    loaded: dict[str, dict] = {}

    def get(model: str, name: str):
        if model not in loaded:
            recipe = RECIPES.get(model)
            loaded[model] = {c.name: c for c in recipe.components(recipe.load("tiny", None, 0))}
        return loaded[model][name]
    return get


def _gate(component, fmt: str, precision: str, folder):
    folder.mkdir()
    exporter = EXPORTERS.get(fmt)
    options = OPTIONS.get(fmt, {})
    result = exporter.export(component, precision, folder / f"{component.name}.{precision}{exporter.extension}", **options)
    report = run_parity(component, exporter, result.files, result.io_float_dtype, precision, {}, None, options)
    assert report.method in ("runtime", "simulated"), report.reason
    return report


@pytest.mark.parametrize("model, name, fmt, precision, bug", [
    ("qwen3-tts", "talker_decode", "coreml", "w4", "head_dropped"),
    ("minicpm-o", "tts_decode", "qnn", "w8a16", "head_dropped"),
    ("smolvla", "action_loop", "mnn", "fp16", "euler_zeroed"),
])
def test_a_planted_graph_bug_fails_where_the_faithful_graph_passes(components, tmp_path, model, name, fmt, precision, bug):
    component = components(model, name)
    sample = next(iter(component.samples.values()))
    before = [t.clone() for t in component.reference(*sample)]
    planted = plant(component, bug)
    after = planted.reference(*sample)
    assert all(torch.equal(a, b) for a, b in zip(before, after)), "the bug reached the reference"
    faithful = _gate(component, fmt, precision, tmp_path / "faithful")
    broken = _gate(planted, fmt, precision, tmp_path / "planted")
    print(f"{model}/{name} {fmt}:{precision}: faithful {faithful.verdict} (e2e {faithful.min_snr_db:.1f}, lowering "
          f"{faithful.lowering['min_snr_db']:.1f}, action error {faithful.max_action_error}); {bug} {broken.verdict} "
          f"(e2e {broken.min_snr_db:.1f}, lowering {broken.lowering['min_snr_db']:.1f}, gate {broken.lowering['threshold_db']}, "
          f"action error {broken.max_action_error}): {broken.failures[:1]}")
    assert faithful.verdict == "pass", faithful.failures
    assert broken.verdict == "fail"
    # the lowering figure (artifact vs the eager model running the file's own scheme) is the one a
    # graph bug cannot hide from, however coarse the scheme
    assert broken.lowering["verdict"] == "fail" and faithful.lowering["verdict"] == "pass"


def test_a_head_dropped_in_a_gguf_q4_0_file_fails_exports_verdict_on_its_stored_tensor(components, tmp_path):
    """GGUF holds no graph: the dropped head is an edit of layer 0's stored output projection, which
    the scheme reference reads back too, so the run's lowering figure cannot see it and its end-to-end
    figure (~17 dB) passes q4_0's 8 dB gate. Export's verdict fails it on the stored tensor, scored
    against an independent quantization of the eager weight."""
    component = components("qwen3-tts", "talker_decode")
    exporter = EXPORTERS.get("gguf")
    result = exporter.export(component, "q4_0", tmp_path / "talker_decode.q4_0.gguf")
    faithful = gate_files(component, exporter, result.files, result.io_float_dtype, "q4_0")
    plant_gguf(result.files[0], "head_dropped")
    broken = gate_files(component, exporter, result.files, result.io_float_dtype, "q4_0")
    stored = broken["quantized_parity"]
    print(f"q4_0 faithful {faithful['verdict']} (e2e {faithful['parity'].min_snr_db:.1f}); head dropped in the file: "
          f"{broken['verdict']} (run {broken['parity'].verdict}, e2e {broken['parity'].min_snr_db:.1f}): {stored['failures']}")
    assert faithful["verdict"] == "pass" and faithful["quantized_parity"]["verdict"] == "pass"
    assert broken["verdict"] == "fail"
    assert stored["verdict"] == "fail" and stored["failures"][0].startswith("blk.0.attn_output.weight")
