"""An RMSNorm in a graph quantized for the HTP (QNN w8a16): its statistic (x * x, the mean, + eps,
the square root and reciprocal) stays in float (`edgex.exporters.qnn_htp.fp16_on_htp`). The mean
square is one value per token and MinMax calibration takes its range from the calibration tokens;
a held-out token with a larger one is clipped to it and the norm's whole output scales with the
clip. A toy layer (RMSNorm -> Linear) calibrated on tokens of small values with one peak of 1, scored
on tokens of values all near 0.9 (each value inside its calibrated range, the mean square 6 x the
largest calibrated): with the statistic in float its lowering figure is near the scheme's
resolution; with the statistic quantized as the rest of the graph it falls into the broken band."""

from __future__ import annotations

import onnx
import pytest
import torch
from torch import nn

import edgex.exporters.qnn_quantize as qnn_quantize
from edgex.component import Component, TensorSpec
from edgex.export import run_parity
from edgex.exporters import EXPORTERS
from edgex.nn.transformer import attach_norm_constants, rms_norm
from edgex.targets import get_target

TOKENS, WIDTH = 8, 32
OPTIONS = get_target("s25-htp").exporter_options["qnn"]


class _RMSNorm(nn.Module):
    """The two attributes of an HF RMSNorm that `rms_norm` reads."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(WIDTH))
        self.variance_epsilon = 1e-6


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.out = _RMSNorm(), nn.Linear(WIDTH, WIDTH)
        attach_norm_constants(self)

    def forward(self, x):
        return (self.out(rms_norm(self.norm, x)),)


def _component() -> Component:
    torch.manual_seed(0)
    module = Layer().eval()
    gen = torch.Generator().manual_seed(1)

    def calibration_tokens():
        x = (0.3 * torch.randn(1, TOKENS, WIDTH, generator=gen)).clamp(-0.9, 0.9)
        x[0, :, 0] = torch.where(torch.rand(TOKENS, generator=gen) < 0.5, -1.0, 1.0)
        return (x,)

    def flat_tokens():
        return (0.9 * torch.sign(torch.randn(1, TOKENS, WIDTH, generator=gen)),)

    def reference(x):
        with torch.no_grad():
            return module(x)

    return Component("layer", "talker", module, [TensorSpec("x", (1, TOKENS, WIDTH), "float32")],
                     [TensorSpec("y", (1, TOKENS, WIDTH), "float32")], reference, {"held_out_flat": flat_tokens()},
                     calibration=lambda n: [calibration_tokens() for _ in range(n)])


def _sqrt_and_reciprocal_only(source, *_):
    graph = onnx.load(str(source), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type in ("Sqrt", "Reciprocal")]


@pytest.mark.parametrize("statistic", ["float", "quantized"])
def test_an_rms_norm_statistic_beyond_its_calibrated_range_stays_exact(tmp_path, monkeypatch, statistic):
    component = _component()
    if statistic == "quantized":
        monkeypatch.setattr(qnn_quantize, "fp16_on_htp", _sqrt_and_reciprocal_only)
    exporter = EXPORTERS.get("qnn")
    result = exporter.export(component, "w8a16", tmp_path / "layer.w8a16.qnn.onnx", **OPTIONS)
    report = run_parity(component, exporter, result.files, result.io_float_dtype, "w8a16", None, None, OPTIONS)
    assert report.method == "simulated", report.reason
    lowering = report.lowering["min_snr_db"]
    print(f"norm statistic {statistic}: {report.verdict}, lowering {lowering:.1f} dB, end-to-end {report.min_snr_db:.1f} dB")
    if statistic == "float":
        assert lowering > 30.0 and report.verdict == "pass", report.failures
    else:
        assert lowering < 20.0 and report.verdict == "fail"
