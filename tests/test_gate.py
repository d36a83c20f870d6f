"""The gate catches a real silent failure: ExecuTorch's int8 weight-only XNNPACK route lowers and
runs, but returns wrong numbers (MODELS.md). It must fail the gate, loudly, never pass, and on
the lowering figure: the eager model running the same int8 weights is fine."""

import json

from conftest import run_cli


def test_int8_weight_only_fails_the_gate(tmp_path):
    proc = run_cli("export", "qwen3-tts", "--target", "cpu", "--preset", "tiny", "--component", "talker_decode",
                   "--format", "executorch", "--precision", "w8", "--out", str(tmp_path), "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "parity gate failed" in proc.stderr
    data = json.loads(proc.stdout)
    (artifact,) = data["artifacts"]
    assert artifact["verdict"] == "fail" and data["status"] == "fail"
    assert artifact["parity"]["method"] == "runtime"
    assert artifact["parity"]["min_snr_db"] < artifact["parity"]["threshold_db"]
    # it is the lowering that is wrong, not the scheme: torchao's int8 weights in eager are fine
    parity = artifact["parity"]
    assert parity["scheme"]["reference"] == "torchao (same config)" and parity["scheme"]["verdict"] == "pass"
    assert parity["lowering"]["verdict"] == "fail" and parity["lowering"]["min_snr_db"] < parity["lowering"]["threshold_db"]
    assert parity["failures"] and all(f.startswith("lowering: ") for f in parity["failures"])
    root = tmp_path / "qwen3-tts" / "cpu"
    # kept only under a clearly failed status, never where a valid artifact would be
    assert not (root / "talker_decode.w8.pte").exists()
    assert (root / "failed" / "talker_decode.w8.pte").exists()
    assert artifact["files"][0]["path"] == "failed/talker_decode.w8.pte"


def test_min_db_override_can_fail_a_good_artifact(tmp_path):
    proc = run_cli("export", "qwen3-tts", "--preset", "tiny", "--component", "talker_decode", "--format", "onnx",
                   "--precision", "fp16", "--min-db", "talker=200", "--out", str(tmp_path), "--json")
    assert proc.returncode == 1
    (artifact,) = json.loads(proc.stdout)["artifacts"]
    assert artifact["parity"]["threshold_db"] == 200.0 and artifact["verdict"] == "fail"
