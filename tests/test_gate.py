"""The gate fails a broken artifact, loudly, and keeps it only under `failed/`.

The broken artifact is the test's own: the tiny Spark decode graph with one attention head dropped
(a wrong head mapping), exported by the real ONNX exporter and run by ONNX Runtime. It stays broken
whatever upstream fixes (the same export without the planted bug passes: test_verify exports it
before tampering with it). The int8 weight-only test below is only a canary for an upstream bug."""

import copy
import json
from dataclasses import replace

import pytest
import torch
from typer.testing import CliRunner

from conftest import cli_here, run_cli
from edgex.cli import app
from edgex.recipes import RECIPES


def _head_dropped(component):
    """A copy of the component whose graph zeroes layer 0's first attention head before out_proj;
    the reference (the eager model) is untouched."""
    module = copy.deepcopy(component.module)
    head_dim = module.config.head_dim
    with torch.no_grad():
        module.model.layers[0].self_attn.out_proj.weight[:, :head_dim] = 0.0
    return replace(component, module=module)


def test_a_graph_that_drops_a_head_fails_the_gate(monkeypatch, tmp_path):
    """Through the CLI in this process (the planted bug is a monkeypatch): exit 1, verdict fail."""
    recipe_type = type(RECIPES.get("spark-x2.5"))
    build = recipe_type.components
    monkeypatch.setattr(recipe_type, "components", lambda self, loaded, names=None: [_head_dropped(c) for c in build(self, loaded, names)])
    result = CliRunner().invoke(app, ["export", "spark-x2.5", "--target", "cpu", "--preset", "tiny", "-c", "decode",
                                      "-f", "onnx", "-p", "fp32", "--out", str(tmp_path), "--json"])
    assert result.exit_code == 1, result.output[-3000:]
    assert "parity gate failed" in result.stderr
    manifest = json.loads(result.stdout)
    (artifact,) = manifest["artifacts"]
    parity = artifact["parity"]
    assert parity["method"] == "runtime" and parity["runtime"] == "onnxruntime"
    assert artifact["verdict"] == "fail" and manifest["status"] == "fail"
    assert parity["min_snr_db"] < parity["threshold_db"] - 20, parity["min_snr_db"]
    root = tmp_path / "spark-x2.5" / "cpu"
    # kept only under a clearly failed status, never where a valid artifact would be
    assert not (root / "decode.fp32.onnx").exists()
    assert (root / "failed" / "decode.fp32.onnx").exists()
    assert [f["path"] for f in artifact["files"]] == ["failed/decode.fp32.onnx", "failed/decode.fp32.onnx.data"]
    assert json.loads((root / "manifest.json").read_text())["status"] == "fail"


@pytest.mark.benchmark  # its answer changes only with the executorch pin: run it when the pin moves
def test_upstream_canary_executorch_int8_weight_only_still_fails_the_gate(tmp_path):
    """Upstream-bug canary, not the gate's test: ExecuTorch 1.5.1's int8 weight-only XNNPACK route
    lowers and runs but returns wrong numbers (docs/toolchains.md), and the gate fails it through the CLI.
    When this test fails, ExecuTorch has fixed the bug: delete the test (and the note in docs/targets-and-formats.md, "ExecuTorch")."""
    proc = run_cli("export", "qwen3-tts", "--target", "cpu", "--preset", "tiny", "--component", "talker_decode",
                   "--format", "executorch", "--precision", "w8", "--out", str(tmp_path), "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "parity gate failed" in proc.stderr
    (artifact,) = json.loads(proc.stdout)["artifacts"]
    assert artifact["verdict"] == "fail" and artifact["parity"]["min_snr_db"] < artifact["parity"]["threshold_db"]
    assert (tmp_path / "qwen3-tts" / "cpu" / "failed" / "talker_decode.w8.pte").exists()
    # it is the lowering that is wrong, not the scheme: the file's int8 weights in eager are fine
    parity = artifact["parity"]
    assert parity["scheme"]["reference"].startswith("read from the file") and parity["scheme"]["verdict"] == "pass"
    assert parity["lowering"]["verdict"] == "fail" and parity["lowering"]["min_snr_db"] < parity["lowering"]["threshold_db"]
    assert parity["failures"] and not any(f.startswith("scheme: ") for f in parity["failures"])
    assert parity["gate"]["figure"] == "lowering"  # end to end it fails too, by less than its lowering


def test_min_db_override_can_fail_a_good_artifact(tmp_path):
    """Also: a preset's random weights are named in the manifest and on the summary's first line."""
    args = ("export", "qwen3-tts", "--preset", "tiny", "--component", "talker_decode", "--format", "onnx",
            "--precision", "fp16", "--min-db", "talker=200", "--out", str(tmp_path))
    proc = cli_here(*args, "--json")
    assert proc.returncode == 1
    data = json.loads(proc.stdout)
    (artifact,) = data["artifacts"]
    assert artifact["parity"]["threshold_db"] == 200.0 and artifact["verdict"] == "fail"
    assert data["source"] == {"preset": "tiny", "seed": 0, "weights": "seeded random"}
    table = cli_here(*args)  # unchanged: the recorded manifest's summary and exit code
    assert table.returncode == 1 and "reused" in table.stderr
    assert table.stdout.splitlines()[0].strip() == "qwen3-tts (preset tiny: seeded random weights, seed 0) -> cpu  (FAIL)"
