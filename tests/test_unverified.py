""""unverified" is not "pass": an artifact no runtime here can run makes `export` and `verify` exit 3
with status "incomplete" and keeps it under `unverified/`; `--allow-unverified KIND` accepts a kind
by name, never a job none of whose files ran and passed. `verify`
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
    assert manifest["status"] == "incomplete" and manifest["allow_unverified"] == []
    assert artifact["verdict"] == "unverified" and artifact["parity"]["method"] == "none"
    assert artifact["parity"]["reason"] == REASON and REASON in result.stderr
    root = tmp_path / "qwen3-tts" / "cpu"
    assert {f["path"] for f in artifact["files"]} == {"unverified/talker_decode.fp32.onnx", "unverified/talker_decode.fp32.onnx.data"}
    assert not (root / "talker_decode.fp32.onnx").exists() and (root / "unverified" / "talker_decode.fp32.onnx").is_file()

    verify = _cli("verify", str(root), "--json")
    assert verify.exit_code == 3 and json.loads(verify.stdout)["status"] == "incomplete"
    assert REASON in verify.stderr
    verify = _cli("verify", str(root), "--json", "--allow-unverified", "sidecar,onnx")
    assert verify.exit_code == 3 and json.loads(verify.stdout)["status"] == "incomplete"  # nothing of the job ran

    no_onnxruntime.undo()  # the runtime is back: verify runs the files where they are, and they pass
    verify = _cli("verify", str(root), "--json")
    assert verify.exit_code == 0, verify.output
    (row,) = json.loads(verify.stdout)["artifacts"]
    assert row["verdict"] == "pass" and row["method"] == "runtime"


def test_accepting_kinds_never_passes_an_export_whose_artifacts_did_not_run(no_onnxruntime, tmp_path):
    """A missing runtime is not a sidecar; naming its format accepts the entry, yet the export's one
    job has no file that ran and passed: incomplete (exit 3), its files still under unverified/.
    The first export builds the job; the others, into the same folder, keep its entry (its job key
    holds no accepted kinds) and judge it again under theirs. A kind edgex does not know is a
    one-line error."""
    for kinds in ("sidecar,onnx", "sidecar", "onnx"):
        result = _cli(*EXPORT, "--out", str(tmp_path), "--allow-unverified", kinds)
        assert result.exit_code == 3, result.output
        manifest = json.loads(result.stdout)
        (artifact,) = manifest["artifacts"]
        assert manifest["status"] == "incomplete" and manifest["allow_unverified"] == sorted(kinds.split(","))
        assert artifact["verdict"] == "unverified" and artifact["files"][0]["path"] == "unverified/talker_decode.fp32.onnx"
        assert REASON in result.stderr
    result = _cli(*EXPORT, "--out", str(tmp_path), "--allow-unverified", "everything")
    assert result.exit_code == 2 and "no such kind 'everything' (known: sidecar," in result.stderr


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


def test_gather_tables_are_read_back_row_by_row_and_unreadable_ones_are_unverified():
    """The table check itself, on arrays: a table is found among a file's constants whatever its
    name, stored as is or transposed; one row changed among 4096 fails it (its whole-table SNR,
    19 dB, would pass a 15 dB gate), named by its index; a format that cannot be read back leaves the tables
    unverified, and an artifact whose run passed is then unverified, not a pass."""
    import numpy as np

    from edgex.component import Component
    from edgex.export import combined_verdict
    from edgex.parity import metrics
    from edgex.parity.tensors import tensor_parity

    table = np.random.default_rng(0).standard_normal((4096, 8)).astype(np.float32)
    broken = table.copy()
    broken[1234] *= -4

    class Format:
        unreadable = "cannot be read back (test)"

        def __init__(self, constants):
            self.constants = constants

        def stored_tensors(self, component, files, precision, **options):
            from edgex.exporters.base import Exporter

            return Exporter.stored_tensors(self, component, files, precision, **options)

        def stored_constants(self, component, files, precision, **options):
            return self.constants

    import torch

    component = Component("c", "r", torch.nn.Identity(), [], [], lambda: (), {}, tables={"embedding": torch.from_numpy(table)})
    other = np.zeros((4096, 8), np.float32)
    good = tensor_parity(Format({"renamed": table.T.copy(), "other": other}), component, [], 30.0, "fp32")
    assert good["verdict"] == "pass" and good["tensors"]["embedding"]["type"] == "table, stored as 'renamed'"
    bad = tensor_parity(Format({"renamed": broken, "other": other}), component, [], 15.0, "fp32")
    figure = bad["tensors"]["embedding"]
    assert bad["verdict"] == "fail" and figure["worst_row"] == 1234 and figure["rows_below_gate"] == 1
    assert figure["snr_db"] < -13 and metrics.snr_db(table, broken) > 15  # whole-table SNR would have passed it
    missing = tensor_parity(Format({"other": other[:, :4]}), component, [], 30.0, "fp32")
    assert missing["verdict"] == "fail" and missing["tensors"]["embedding"]["error"] == "missing from the file"
    unread = tensor_parity(Format(None), component, [], 30.0, "fp32")
    assert unread["verdict"] == "unverified" and "cannot be read back (test)" in unread["unverified"]
    assert combined_verdict("pass", unread["verdict"]) == "unverified" and combined_verdict("pass", good["verdict"]) == "pass"
    assert combined_verdict("pass", bad["verdict"]) == "fail"
