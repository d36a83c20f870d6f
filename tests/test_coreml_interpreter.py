"""The Core ML reference interpreter itself: it covers every MIL op the qwen3-tts components produce
with fp32 results equal to torch, and it refuses ops it does not know (parity method `none`, op
named). A corrupted weight inside a saved .mlpackage failing the gate through it:
tests/test_fault_injection.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("coremltools")

from edgex.component import LOGITS, SIGNAL, TOKENS, Component, TensorSpec  # noqa: E402
from edgex.export import export_model, run_parity  # noqa: E402
from edgex.exporters import EXPORTERS  # noqa: E402
from edgex.parity.mil import MilInterpreter  # noqa: E402
from edgex.parity.runtimes import RUNTIMES  # noqa: E402
from edgex.parity.runtimes.base import Unsupported  # noqa: E402

# Every op type in the fp16 / fp32 Core ML programs of the seven qwen3-tts components (tiny preset;
# the manifest's `details.mil_ops` lists them per artifact), plus the weight decompressor of w8 / w4.
QWEN3_TTS_OPS = {
    "add", "cast", "clip", "concat", "const", "conv", "conv_transpose", "cos", "equal", "expand_dims",
    "gather", "gelu", "greater_equal", "layer_norm", "less", "less_equal", "linear", "logical_and",
    "matmul", "maximum", "mul", "pad", "pow", "reduce_argmax", "reshape", "rsqrt", "select", "silu",
    "sin", "slice_by_index", "softmax", "stack", "sub", "tile", "transpose",
}  # split / squeeze left with the graphs' own RVQ decode (no qwen3-tts program holds them now)
# Components whose fp32 programs hold every op above except reduce_argmax (which only the 15-step
# code_predictor holds; a small graph covers it instead of the minute-long unrolled conversion).
COVERING = ["talker_decode", "code_predictor_step", "code2latent", "latent2wav"]


class _SampleHead(torch.nn.Module):
    """A linear head with Gumbel-max sampling: the predictor's argmax step in a small graph."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(16, 40)

    def forward(self, hidden, noise):
        logits = self.head(hidden)
        return torch.argmax(logits + noise, dim=-1), logits


def _sample_head_component() -> Component:
    torch.manual_seed(0)
    module = _SampleHead().eval()
    samples = {f"s{i}": (torch.randn(1, 3, 16), torch.rand(1, 3, 40) * i) for i in range(2)}
    reference = lambda h, n: module(h, n)  # noqa: E731
    return Component("sample_head", "predictor", module,
                     [TensorSpec("hidden", (1, 3, 16), "float32"), TensorSpec("noise", (1, 3, 40), "float32")],
                     [TensorSpec("codes", (1, 3), "int64", TOKENS), TensorSpec("logits", (1, 3, 40), "float32", LOGITS)],
                     reference, samples)


def test_interpreter_covers_every_component_op_at_fp32_parity(tmp_path):
    manifest = export_model("qwen3-tts", "apple", tmp_path, preset="tiny", components=COVERING, precisions=["fp32"])
    covered = set()
    for a in manifest["artifacts"]:
        parity = a["parity"]
        assert parity["method"] == "simulated" and parity["simulator"] == "edgex-mil-interpreter", a
        assert parity["min_snr_db"] >= 60.0 and a["verdict"] == "pass", (a["component"], parity["min_snr_db"])
        covered |= set(a["details"]["mil_ops"])
    component = _sample_head_component()
    dest = tmp_path / "sample_head.fp32.mlpackage"
    result = EXPORTERS.get("coreml").export(component, "fp32", dest)
    report = run_parity(component, EXPORTERS.get("coreml"), result.files, "float32", "fp32", None, None)
    assert report.verdict == "pass" and report.min_snr_db >= 60.0 and report.min_token_agreement == 1.0, report
    covered |= set(result.details["mil_ops"])
    assert QWEN3_TTS_OPS <= covered, sorted(QWEN3_TTS_OPS - covered)


def _package_with(tmp_path: Path, build) -> Path:
    """Save a one-op ML program built with coremltools' MIL builder."""
    import coremltools as ct
    from coremltools.converters.mil import Builder as mb

    prog = mb.program(input_specs=[mb.TensorSpec(shape=(1, 4, 8))], opset_version=ct.target.iOS18)(build)
    path = tmp_path / "probe.mlpackage"
    ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
               compute_precision=ct.precision.FLOAT32, skip_model_load=True).save(str(path))
    return path


def test_unknown_op_reports_method_none_naming_the_op(tmp_path, monkeypatch):
    from coremltools.converters.mil import Builder as mb

    monkeypatch.setattr("edgex.parity.runtimes.coreml._on_macos", lambda: False)
    path = _package_with(tmp_path, lambda x: mb.instance_norm(x=x, epsilon=1e-5))
    with pytest.raises(Unsupported, match="does not implement MIL op.*instance_norm"):
        RUNTIMES.get("coreml").load([path])
    module = torch.nn.InstanceNorm1d(4).eval()
    component = Component("norm", "decoder", module, [TensorSpec("x", (1, 4, 8), "float32")],
                          [TensorSpec("y", (1, 4, 8), "float32", SIGNAL)], lambda x: (module(x),),
                          {"a": (torch.randn(1, 4, 8),)})
    report = run_parity(component, EXPORTERS.get("coreml"), [path], "float32", "fp32", None, None)
    assert report.method == "none" and "instance_norm" in report.reason and report.verdict == "unverified"


def test_known_ops_run_by_coremltools_definitions_match_numpy(tmp_path):
    """Ops without an edgex kernel run through coremltools' value semantics: spot-check two."""
    from coremltools.converters.mil import Builder as mb

    path = _package_with(tmp_path, lambda x: mb.softmax(x=mb.mul(x=x, y=np.float32(3.0)), axis=-1))
    x = np.random.default_rng(0).standard_normal((1, 4, 8)).astype(np.float32)
    expected = torch.softmax(torch.from_numpy(x) * 3, dim=-1).numpy()
    (out,) = MilInterpreter(path).run([x])
    assert out.dtype == np.float32 and np.allclose(out, expected, atol=1e-6)


@pytest.mark.parametrize("align", [False, True])
def test_upsample_bilinear_kernel_matches_torch(align):
    """pi0's vision encoder resizes each camera with F.interpolate (bilinear), which Core ML holds as
    MIL `upsample_bilinear`: the kernel equals torch's on up- and down-scaling, and a wrong grid
    (align_corners flipped) does not."""
    from edgex.parity.mil.kernels import KERNELS

    x = np.random.default_rng(0).random((1, 3, 48, 64), dtype=np.float32)
    for sh, sw in ((56 / 48, 56 / 48), (0.5, 0.75)):
        args = {"x": x, "scale_factor_height": sh, "scale_factor_width": sw, "align_corners": align}
        (out,) = KERNELS["upsample_bilinear"](args)
        size = (int(48 * sh), int(64 * sw))
        expected = torch.nn.functional.interpolate(torch.from_numpy(x), size=size, mode="bilinear", align_corners=align).numpy()
        assert out.shape == expected.shape and np.abs(out - expected).max() < 1e-5
        (flipped,) = KERNELS["upsample_bilinear"](args | {"align_corners": not align})
        assert np.abs(flipped - expected).max() > 1e-2


def test_batch_norm_and_max_pool_kernels_match_torch():
    """ACT's ResNet trunk converts to MIL `batch_norm` (coremltools fuses the folded norms' per-channel
    multiply-add into it) and `max_pool` (3x3, stride 2, pad 1): without kernels its apple export was
    `unverified`. Each equals torch, and a wrong epsilon / pad does not."""
    from edgex.parity.mil.kernels import KERNELS

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1, 4, 9, 7)).astype(np.float32)
    mean, var, gamma, beta = (rng.random(4).astype(np.float32) + 0.5 for _ in range(4))
    args = {"x": x, "mean": mean, "variance": var, "gamma": gamma, "beta": beta, "epsilon": 1e-3}
    expected = torch.nn.functional.batch_norm(torch.from_numpy(x), torch.from_numpy(mean), torch.from_numpy(var),
                                              torch.from_numpy(gamma), torch.from_numpy(beta), eps=1e-3).numpy()
    (out,) = KERNELS["batch_norm"](args)
    assert np.abs(out - expected).max() < 1e-5
    assert np.abs(KERNELS["batch_norm"](args | {"epsilon": 1.0})[0] - expected).max() > 1e-2
    for ceil in (False, True):
        pool = {"x": x, "kernel_sizes": [3, 3], "strides": [2, 2], "pad_type": "custom", "pad": [1, 1, 1, 1],
                "ceil_mode": ceil}
        expected = torch.nn.functional.max_pool2d(torch.from_numpy(x), 3, 2, padding=1, ceil_mode=ceil).numpy()
        (out,) = KERNELS["max_pool"](pool)
        assert out.shape == expected.shape and np.array_equal(out, expected)
    (unpadded,) = KERNELS["max_pool"](pool | {"pad_type": "valid", "ceil_mode": False})
    assert unpadded.shape != expected.shape


class _Reciprocal(torch.nn.Module):
    def forward(self, x):
        return x * (1.0 / (10000.0 ** (torch.arange(8, dtype=torch.float32) / 8)))


def test_reciprocal_converts_exactly(tmp_path):
    """coremltools converts aten.reciprocal to MIL `inverse`, whose default epsilon gives 1 / (x + 1e-4)
    (pi0's RoPE frequencies, fp32 action_step 53.7 dB): the exporter rewrites it to x^-1."""
    module = _Reciprocal().eval()
    x = torch.randn(1, 4, 8)
    component = Component("recip", "decoder", module, [TensorSpec("x", (1, 4, 8), "float32")],
                          [TensorSpec("y", (1, 4, 8), "float32", SIGNAL)], lambda x: (module(x),), {"a": (x,)})
    result = EXPORTERS.get("coreml").export(component, "fp32", tmp_path / "recip.fp32.mlpackage")
    assert "inverse" not in result.details["mil_ops"]
    (out,) = MilInterpreter(result.files[0]).run([x.numpy()])
    expected = module(x).numpy()
    assert np.abs(out - expected).max() <= 1e-6 * np.abs(expected).max()
