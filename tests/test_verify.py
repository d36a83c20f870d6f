"""`edgex verify` re-runs parity from a manifest and catches tampered or truncated artifacts."""

import json
import shutil

import numpy as np
import pytest

from conftest import cpu_export_artifacts, run_cli
from edgex.artifacts.files import file_records
from edgex.recipes.qwen3_tts.facts import ROLES


@pytest.fixture(scope="module")
def export_copy(cpu_export, tmp_path_factory):
    out, proc = cpu_export
    assert proc.returncode == 0, proc.stderr[-3000:]
    copy = tmp_path_factory.mktemp("verify") / "out"
    shutil.copytree(out, copy)
    return copy / "qwen3-tts" / "cpu"


def test_verify_reruns_parity_and_flags_exactly_the_tampered_artifacts(export_copy, tmp_path):
    """One run covers both sides: the 26 untouched artifacts re-pass in their runtimes, the two
    tampered ones (a flipped byte, a truncation) fail."""
    tampered = tmp_path / "cpu"
    shutil.copytree(export_copy, tampered)
    data = tampered / "talker_decode.fp32.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte, same size
    data.write_bytes(bytes(raw))
    pte = tampered / "code2wav.fp16.pte"
    pte.write_bytes(pte.read_bytes()[:1000])
    proc = run_cli("verify", str(tampered), "--json")
    assert proc.returncode == 1
    assert "verification failed: 2 problem(s)" in proc.stderr
    report = json.loads(proc.stdout)
    bad = {(a["component"], a["format"], a["precision"]): a["problem"] for a in report["artifacts"] if a["verdict"] != "pass"}
    assert set(bad) == {("talker_decode", "onnx", "fp32"), ("code2wav", "pte", "fp16")}
    assert "sha256" in bad[("talker_decode", "onnx", "fp32")]
    assert "bytes" in bad[("code2wav", "pte", "fp16")]
    good = [a for a in report["artifacts"] if a["verdict"] == "pass"]
    assert len(good) == len(cpu_export_artifacts(ROLES)) - 2 and all(a["files"] == "ok" and a["method"] == "runtime" for a in good)
    assert all(a["min_snr_db"] >= a["threshold_db"] for a in good)


def test_verify_parity_catches_a_tampered_onnx_whose_manifest_hashes_were_updated(tmp_path):
    """Hashes are not the only line: layer 0's MLP silenced inside the ONNX file (its norm weight,
    a named initializer, zeroed), the manifest's sha256 and sizes rewritten to match, and verify's
    re-run parity still fails it. The untampered export passed its gate (exit 0)."""
    import onnx
    from onnx import numpy_helper

    proc = run_cli("export", "spark-x2.5", "--preset", "tiny", "-c", "decode", "-f", "onnx", "-p", "fp32",
                   "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    root = tmp_path / "spark-x2.5" / "cpu"
    manifest = json.loads((root / "manifest.json").read_text())
    (entry,) = manifest["artifacts"]
    path = root / entry["files"][0]["path"]
    model = onnx.load(str(path))
    (weight,) = [t for t in model.graph.initializer if t.name == "model.layers.0.post_attention_layernorm.weight"]
    weight.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(weight)), weight.name))
    data = [r["path"] for r in entry["files"] if r["path"] != entry["files"][0]["path"]]
    onnx.save(model, str(path), save_as_external_data=bool(data), all_tensors_to_one_file=True,
              location=data[0].split("/")[-1] if data else None)
    entry["files"] = [record for r in entry["files"] for record in file_records(root / r["path"], root)]
    (root / "manifest.json").write_text(json.dumps(manifest))

    proc = run_cli("verify", str(root), "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["artifacts"]
    assert row["files"] == "ok" and row["method"] == "runtime", row  # the hashes match: parity caught it
    assert row["verdict"] == "fail" and "dB gate" in row["problem"] and "below the" in row["problem"], row
    assert row["min_snr_db"] < row["threshold_db"] - 20, row
