"""`edgex verify` re-runs parity from a manifest and catches tampered or truncated artifacts."""

import json
import shutil

import pytest

from conftest import run_cli


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
    assert len(good) == 26 and all(a["files"] == "ok" and a["method"] == "runtime" for a in good)
    assert all(a["min_snr_db"] >= a["threshold_db"] for a in good)
