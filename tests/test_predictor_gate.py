"""Broken code predictors, exported by the real exporters and run in the real runtimes, fail the
gate below fp32 too: one that ignores its noise input (it decodes greedily whatever the runner
asked), one whose sampler returns wrong codes while its logits stay faithful to them. The same
graph unbroken passes. ONNX fp16 and MNN w8 (a quantized scheme, converted from the same ONNX graph
in seconds; ExecuTorch's lowering of the 15-step frame takes minutes per artifact, too slow for the
suite, and the gate code under test is the same for every format)."""

from dataclasses import replace

import pytest
import torch

from edgex.exporters import EXPORTERS
from edgex.export import run_parity
from edgex.recipes import RECIPES
from edgex.recipes.qwen3_tts.predictor import CodePredictorFrame

pytestmark = pytest.mark.xdist_group("predictor_gate")
WRONG_CODE = 7


class IgnoresNoise(CodePredictorFrame):
    def forward(self, talker_hidden, code0, noise):
        return super().forward(talker_hidden, code0, noise * 0.0)


class SamplesOneCode(CodePredictorFrame):
    """Its sampler takes code 7 at every step (a bias far above any score); the logits it returns
    are the predictor's own for the codes it fed back."""

    def __init__(self, talker):
        super().__init__(talker)
        bias = torch.zeros(1, 15, self.heads[0].weight.shape[0])
        bias[..., WRONG_CODE] = 1e4
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, talker_hidden, code0, noise):
        return super().forward(talker_hidden, code0, noise + self.bias)


@pytest.fixture(scope="module")
def predictor():
    recipe = RECIPES.get("qwen3-tts")
    loaded = recipe.load("tiny", None, 0)
    (comp,) = recipe.components(loaded, ["code_predictor"])
    return loaded.models.talker, comp


@pytest.mark.parametrize("variant, fmt, precision", [
    pytest.param(v, f, p, id=f"{getattr(v, '__name__', 'None')}-{f}-{p}",
                 # each gate (ONNX fp16, MNN w8) has its faithful and one broken predictor in the suite, and
                 # each way of breaking it one format: the other two cases fail alike, a benchmark
                 marks=[pytest.mark.benchmark] if (v, f) in ((IgnoresNoise, "mnn"), (SamplesOneCode, "onnx")) else [])
    for f, p in (("onnx", "fp16"), ("mnn", "w8")) for v in (None, IgnoresNoise, SamplesOneCode)])
def test_broken_predictor_fails_and_faithful_one_passes(predictor, tmp_path, variant, fmt, precision):
    talker, comp = predictor
    if variant is not None:
        comp = replace(comp, module=variant(talker).eval(), _reference_outputs=comp._reference_outputs)
    exporter = EXPORTERS.get(fmt)
    result = exporter.export(comp, precision, tmp_path / f"code_predictor.{precision}{exporter.extension}")
    report = run_parity(comp, exporter, result.files, result.io_float_dtype, precision, None, None)
    assert report.method == "runtime"
    print(f"{fmt} {precision} {getattr(variant, '__name__', 'faithful')}: {report.verdict}, min SNR {report.min_snr_db:.2f} dB "
          f"(gate {report.threshold_db}), divergences {report.divergences}, failures {report.failures}")
    flipped = [d for d in report.divergences if d["output"] == "codes" and not d["tie"]]
    if variant is None:
        assert report.verdict == "pass", report.failures
        assert report.min_snr_db >= report.threshold_db and not flipped
        return
    assert report.verdict == "fail"
    assert flipped and all(d["margin"] > d["tie_margin"] for d in flipped)
    if variant is IgnoresNoise:  # greedy samples are right; the sampled one is not
        assert {d["sample"] for d in flipped} == {"utterance_b_frame30_sampled"}
    else:
        assert {d["artifact"] for d in flipped} == {WRONG_CODE}
        assert len({d["sample"] for d in flipped}) == len(comp.samples)
    # teacher-forced on the artifact's codes, its logits and codec embeds are still faithful: the
    # codes alone fail it, and every step of every output was compared
    assert report.min_snr_db >= report.threshold_db, report.samples
    diverged = {d["sample"] for d in report.divergences if d["output"] == "codes"}
    for name, sample in report.samples.items():
        assert sample["codes"]["teacher_forced"] == (name in diverged)
        assert "compared_steps" not in sample["logits"] and "skipped" not in sample["codec_embeds"]
