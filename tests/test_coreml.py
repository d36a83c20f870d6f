"""Format Core ML: .mlpackage artifacts for target `apple`, parity by the reference interpreter on
Linux (method `simulated`, interpreter named), real prediction selected on macOS."""

import json
import sys

import pytest

from conftest import cli_here
from edgex.errors import EdgexError

pytest.importorskip("coremltools")


def test_apple_target_exports_mlpackages_with_simulated_parity(tmp_path):
    proc = cli_here("export", "qwen3-tts", "--target", "apple", "--preset", "tiny", "-c", "code_predictor_step",
                   "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["target_facts"]["compute_units"]["predictor"] == "CPU_AND_NE"
    db = {}
    for a in data["artifacts"]:
        parity = a["parity"]
        assert a["format"] == "mlpackage" and parity["method"] == "simulated", parity
        assert parity["runtime"] == "coreml" and parity["simulator"] == "edgex-mil-interpreter"
        assert a["verdict"] == "pass" and a["details"]["minimum_deployment_target"] == "iOS18"
        paths = {f["path"] for f in a["files"]}
        package = f"{a['component']}.{a['precision']}.mlpackage"
        assert f"{package}/Data/com.apple.CoreML/model.mlmodel" in paths
        assert (tmp_path / "qwen3-tts" / "apple" / package / "Manifest.json").is_file()
        db[a["precision"]] = parity["min_snr_db"]
    assert set(db) == {"fp16", "w8"}  # its w4 is built on request only (`RecipeFacts.coarse`)
    assert db["fp16"] > db["w8"] > 20.0
    size = {a["precision"]: sum(f["bytes"] for f in a["files"]) for a in data["artifacts"]}
    assert size["fp16"] > size["w8"]
    verify = cli_here("verify", str(tmp_path / "qwen3-tts" / "apple"), "--json")
    assert verify.returncode == 0, verify.stderr[-2000:]
    assert {a["verdict"] for a in json.loads(verify.stdout)["artifacts"]} == {"pass"}


def test_macos_selects_real_prediction(monkeypatch):
    from edgex.parity.runtimes import RUNTIMES

    runtime = RUNTIMES.get("coreml")
    monkeypatch.setattr("edgex.parity.runtimes.coreml._on_macos", lambda: True)
    assert (runtime.method, runtime.simulator) == ("runtime", None)
    monkeypatch.setattr("edgex.parity.runtimes.coreml._on_macos", lambda: False)
    assert (runtime.method, runtime.simulator) == ("simulated", "edgex-mil-interpreter")


def test_missing_coremltools_names_the_extra(monkeypatch):
    from edgex.exporters import EXPORTERS

    monkeypatch.setitem(sys.modules, "coremltools", None)
    with pytest.raises(EdgexError, match=r"needs coremltools, which is not installed: pip install 'edgex\[coreml\]'"):
        EXPORTERS.get("coreml").check("fp16")


def test_unsupported_precision_is_refused():
    from edgex.exporters import EXPORTERS

    with pytest.raises(EdgexError, match="does not support precision '8da4w'"):
        EXPORTERS.get("coreml").check("8da4w")


def test_w8_and_w4_compress_the_component_s_one_fp16_conversion(tmp_path, monkeypatch):
    """A conversion runs the whole MIL pass pipeline (minutes on an unrolled loop graph): a
    component's fp16, w8 and w4 programs come from one torch.export + conversion, and the
    compressed ones still hold the compressed weights and score like their scheme."""
    import numpy as np
    import torch

    from edgex.component import SIGNAL, Component, TensorSpec
    from edgex.exporters import EXPORTERS
    from edgex.parity.metrics import snr_db
    from edgex.parity.runtimes import RUNTIMES

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).eval()
    x = torch.randn(1, 4, 64)
    component = Component("mlp", "decoder", module, [TensorSpec("x", (1, 4, 64), "float32")],
                          [TensorSpec("y", (1, 4, 64), "float32", SIGNAL)], module, {"s": (x,)})
    exports, real = [], torch.export.export
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: exports.append(1) or real(*a, **k))
    exporter, runtime = EXPORTERS.get("coreml"), RUNTIMES.get("coreml")
    db = {}
    for precision in ("fp16", "w8", "w4"):
        dest = tmp_path / f"mlp.{precision}.mlpackage"
        result = exporter.export(component, precision, dest)
        ops = result.details["mil_ops"]
        assert ("constexpr_blockwise_shift_scale" in ops) == (precision != "fp16"), (precision, ops)
        if precision != "fp16":
            assert len(exporter.stored_scheme(component, precision, [dest]).weights) == 2
        out = runtime.load([dest], threads=1).run([x.numpy()])[0]
        db[precision] = snr_db(module(x).detach().numpy(), np.asarray(out))
    assert len(exports) == 1
    assert db["fp16"] > db["w8"] > db["w4"] > 10.0, db
    with torch.no_grad():  # a weight written in place: the kept program is stale, so it is converted again
        module[0].weight.mul_(2)
    exporter.export(component, "w8", tmp_path / "changed.w8.mlpackage")
    assert len(exports) == 2
