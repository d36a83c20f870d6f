"""A sampling graph quantized for the HTP (QNN w8a16): the Add of its noise input to the scores stays
in float (`edgex.exporters.qnn_htp.sampling_nodes`). Calibrated by min / max, that Add's static range
comes from a few noise draws; a later draw beyond it saturates, several codes then share the top
score and the argmax among them is arbitrary. A toy sampler (Linear -> logits, + noise -> argmax)
whose held-out noise puts three codes above every calibrated score: exported as edgex exports it,
its sampled codes equal the reference's; with the Add quantized as the rest of the graph, a code
flips at a margin far beyond the tie margin."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import edgex.exporters.qnn_quantize as qnn_quantize
from edgex.component import LOGITS, TOKENS, Component, TensorSpec
from edgex.export import run_parity
from edgex.exporters import EXPORTERS
from edgex.targets import get_target

STEPS, WIDTH, VOCAB = 4, 16, 32
OPTIONS = get_target("s25-htp").exporter_options["qnn"]


class Sampler(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(WIDTH, VOCAB)

    def forward(self, hidden, noise):
        logits = self.proj(hidden)
        return torch.argmax(logits + noise, dim=-1), logits


def _component() -> Component:
    torch.manual_seed(0)
    module = Sampler().eval()
    gen = torch.Generator().manual_seed(1)

    def inputs(scale: float):
        hidden = torch.randn(1, STEPS, WIDTH, generator=gen)
        uniform = torch.rand(1, STEPS, VOCAB, generator=gen).clamp(1e-6, 1 - 1e-6)
        return hidden, scale * -torch.log(-torch.log(uniform))  # Gumbel noise

    hidden, noise = inputs(1.0)
    # codes 2, 15, 28 far above any calibrated score, code 15 the reference's by 1.0
    noise[0, :, [2, 15, 28]] = torch.tensor([40.0, 41.0, 40.0]) - module.proj(hidden).detach()[0][:, [2, 15, 28]]

    def reference(h, n):
        with torch.no_grad():
            logits = module.proj(h)
            return torch.argmax(logits + n, dim=-1), logits

    def forced(inputs_, tokens):
        return tokens["codes"], reference(*inputs_)[1]

    return Component(
        "sampler", "predictor", module,
        [TensorSpec("hidden", (1, STEPS, WIDTH), "float32"), TensorSpec("noise", (1, STEPS, VOCAB), "float32")],
        [TensorSpec("codes", (1, STEPS), "int64", TOKENS, ("logits", "noise")), TensorSpec("logits", (1, STEPS, VOCAB), "float32", LOGITS)],
        reference, {"sampled": (hidden, noise)}, calibration=lambda n: [inputs(1.0) for _ in range(n)],
        forced_reference=forced,
    )


@pytest.mark.parametrize("add", ["float", "quantized"])
def test_the_noise_add_of_a_sampling_graph_stays_float(tmp_path, monkeypatch, add):
    component = _component()
    if add == "quantized":
        monkeypatch.setattr(qnn_quantize, "sampling_nodes", lambda source, component: [])
    exporter = EXPORTERS.get("qnn")
    result = exporter.export(component, "w8a16", tmp_path / "sampler.w8a16.qnn.onnx", **OPTIONS)
    report = run_parity(component, exporter, result.files, result.io_float_dtype, "w8a16", None, None, OPTIONS)
    assert report.method == "simulated", report.reason
    flips = [d for d in report.divergences if d["output"] == "codes"]
    print(f"noise Add {add}: {report.verdict}, flips {[(d['reference'], d['artifact'], round(d['margin'], 3)) for d in flips]}")
    if add == "float":
        assert not flips and report.verdict == "pass", report.failures
    else:
        assert flips and all(d["reference"] == 15 and d["margin"] > d["tie_margin"] for d in flips)
        assert report.verdict == "fail"
