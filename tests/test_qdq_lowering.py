"""QNN static QDQ: the lowering gate compares the context binary (HTP simulator) with the eager
model running the weights and activation scales of the QDQ graph it was compiled from (the graph
is read, never run); the scheme figure compares that eager model with fp32 eager. A context binary
compiled from a graph with one wrong weight scale (what a lowering that misreads a
DequantizeLinear computes) fails the lowering gate while its scheme figure is the faithful
artifact's, to the bit: the scheme reference is made from the graph edgex built, not the binary."""

from __future__ import annotations

import onnx
import pytest
from onnx import numpy_helper

import edgex.exporters.qnn as qnn
from edgex.export import run_parity
from edgex.exporters import EXPORTERS
from edgex.parity.gates import LOWERING_DB
from edgex.recipes import RECIPES
from edgex.targets import get_target

pytestmark = pytest.mark.xdist_group("qdq_lowering")
PRECISION = "w8a16"
OPTIONS = get_target("s25-htp").exporter_options["qnn"]


def _wrong_scale(path, dest) -> str:
    """The QDQ graph at `path` with the scale of its largest weight's DequantizeLinear x4, at `dest`."""
    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    sizes = {n.input[1]: len(inits[n.input[0]].raw_data) for n in model.graph.node
             if n.op_type == "DequantizeLinear" and n.input[0] in inits and n.input[1] in inits}
    name = max(sizes, key=sizes.get)
    inits[name].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(inits[name]) * 4, name))
    onnx.save(model, str(dest))
    return name


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    recipe = RECIPES.get("qwen3-tts")
    (comp,) = recipe.components(recipe.load("tiny", None, 0), ["talker_decode"])
    exporter = EXPORTERS.get("qnn")
    compile_ = qnn.htp_session
    broken = []

    def miscompiled(model, **kwargs):  # the binary and the .dlc come from a graph with a wrong scale
        if str(model).endswith(".qdq.onnx"):
            wrong = model.with_name("wrong_scale.onnx")
            broken.append(_wrong_scale(model, wrong))
            model = wrong
        return compile_(model, **kwargs)

    out = {}
    for name in ("faithful", "broken"):
        folder = tmp_path_factory.mktemp(name)
        with pytest.MonkeyPatch.context() as patch:
            if name == "broken":
                patch.setattr(qnn, "htp_session", miscompiled)
            result = exporter.export(comp, PRECISION, folder / f"talker_decode.{PRECISION}.qnn.onnx", **OPTIONS)
        out[name] = run_parity(comp, exporter, result.files, result.io_float_dtype, PRECISION, None, None, OPTIONS)
    assert broken, "the QDQ graph was never compiled"
    return out


def test_faithful_qdq_binary_passes_a_tight_lowering_gate(reports):
    report = reports["faithful"]
    assert report.method == "simulated" and report.verdict == "pass", report.failures
    assert report.lowering["threshold_db"] == LOWERING_DB[PRECISION]
    assert report.scheme["source"].startswith("eager model with the QDQ graph's weights") and report.scheme["graph_sha256"]
    print(f"faithful: e2e {report.min_snr_db:.1f}, scheme {report.scheme['min_snr_db']:.1f}, lowering {report.lowering['min_snr_db']:.1f} dB")


def test_wrong_scale_in_the_binary_fails_lowering_with_the_scheme_unchanged(reports):
    faithful, broken = reports["faithful"], reports["broken"]
    assert broken.verdict == "fail"
    assert broken.lowering["verdict"] == "fail" and broken.lowering["min_snr_db"] < LOWERING_DB[PRECISION]
    assert broken.scheme["verdict"] == "pass" and broken.scheme["min_snr_db"] == faithful.scheme["min_snr_db"]
    assert broken.scheme["graph_sha256"] == faithful.scheme["graph_sha256"]
    assert any(f.startswith("lowering: ") for f in broken.failures) and not any(f.startswith("scheme: ") for f in broken.failures)
    print(f"wrong scale: lowering {broken.lowering['min_snr_db']:.1f} dB (faithful {faithful.lowering['min_snr_db']:.1f}), "
          f"scheme {broken.scheme['min_snr_db']:.1f} dB both")
