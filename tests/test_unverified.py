""""unverified" is not "pass": an artifact no runtime here can run makes `export` and `verify` exit 3
with status "incomplete" and keeps it under `unverified/`, unless --allow-unverified. `verify`
re-gates from code and the manifest's recorded overrides, not from the manifest's figures.

The CLI runs in-process so a runtime can be made unavailable with monkeypatch."""

import json

import pytest
from typer.testing import CliRunner

from edgex.cli import app
from edgex.parity.runtimes import RUNTIMES

pytestmark = pytest.mark.xdist_group("unverified")
REASON = "onnxruntime is not installed (test)"
EXPORT = ["export", "qwen3-tts", "--preset", "tiny", "-c", "talker_decode", "-f", "onnx", "-p", "fp32", "--json"]


def _cli(*args):
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.fixture
def no_onnxruntime(monkeypatch):
    monkeypatch.setattr(RUNTIMES.get("onnxruntime"), "unavailable_reason", lambda: REASON)
    return monkeypatch


def test_missing_runtime_is_incomplete_unless_allowed(no_onnxruntime, tmp_path):
    result = _cli(*EXPORT, "--out", str(tmp_path))
    assert result.exit_code == 3, result.output
    manifest = json.loads(result.stdout)
    (artifact,) = manifest["artifacts"]
    assert manifest["status"] == "incomplete" and manifest["allow_unverified"] is False
    assert artifact["verdict"] == "unverified" and artifact["parity"]["method"] == "none"
    assert artifact["parity"]["reason"] == REASON and REASON in result.stderr
    root = tmp_path / "qwen3-tts" / "cpu"
    assert {f["path"] for f in artifact["files"]} == {"unverified/talker_decode.fp32.onnx", "unverified/talker_decode.fp32.onnx.data"}
    assert not (root / "talker_decode.fp32.onnx").exists() and (root / "unverified" / "talker_decode.fp32.onnx").is_file()

    verify = _cli("verify", str(root), "--json")
    assert verify.exit_code == 3 and json.loads(verify.stdout)["status"] == "incomplete"
    assert REASON in verify.stderr
    verify = _cli("verify", str(root), "--json", "--allow-unverified")
    assert verify.exit_code == 0 and json.loads(verify.stdout)["status"] == "pass"

    no_onnxruntime.undo()  # the runtime is back: verify runs the files where they are, and they pass
    verify = _cli("verify", str(root), "--json")
    assert verify.exit_code == 0, verify.output
    (row,) = json.loads(verify.stdout)["artifacts"]
    assert row["verdict"] == "pass" and row["method"] == "runtime"


def test_allow_unverified_passes_and_says_why(no_onnxruntime, tmp_path):
    result = _cli(*EXPORT, "--out", str(tmp_path), "--allow-unverified")
    assert result.exit_code == 0, result.output
    manifest = json.loads(result.stdout)
    (artifact,) = manifest["artifacts"]
    assert manifest["status"] == "pass" and manifest["allow_unverified"] is True
    assert artifact["verdict"] == "unverified" and artifact["files"][0]["path"] == "talker_decode.fp32.onnx"
    assert "unverified" in result.stderr and REASON in result.stderr


def test_verify_regates_from_code_and_recorded_overrides(tmp_path):
    result = _cli(*EXPORT, "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    root = tmp_path / "qwen3-tts" / "cpu"
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["artifacts"][0]["parity"]["threshold_db"] = -50.0  # an edit the hashes do not cover
    (root / "manifest.json").write_text(json.dumps(manifest))
    (row,) = json.loads(_cli("verify", str(root), "--json").stdout)["artifacts"]
    assert row["threshold_db"] == 60.0 and "-50.0" in row["note"] and row["verdict"] == "pass"

    manifest["gate_overrides"] = {"talker": 500.0}  # a user override the export recorded
    (root / "manifest.json").write_text(json.dumps(manifest))
    verify = _cli("verify", str(root), "--json")
    assert verify.exit_code == 1
    (row,) = json.loads(verify.stdout)["artifacts"]
    assert row["threshold_db"] == 500.0 and row["verdict"] == "fail" and "below the 500.0 dB gate" in row["problem"]
