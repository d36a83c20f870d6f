"""The manifest: strict JSON whatever the figures (an exact tensor scores inf), never missing beside
artifacts that look valid (even when the export dies while writing it), and a verdict per entry
that only a run of that entry's own files can make a pass."""

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import edgex.export
from conftest import cli_here
from edgex.artifacts.files import sha256, strict_json
from edgex.errors import EdgexError
from edgex.export import _gate_and_place, combined_verdict, export_model
from edgex.recipes.spark_x25.config import get_preset
from edgex.recipes.spark_x25.model import build
from test_spark import _write_checkpoint


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"non-strict JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


def test_strict_json_writes_non_finite_figures_as_strings():
    value = {"a": math.inf, "b": [np.float32("-inf"), (np.float64("nan"), 1.5)], "c": np.int64(3), "d": True, "e": None}
    assert strict_json(value) == {"a": "inf", "b": ["-inf", ["nan", 1.5]], "c": 3, "d": True, "e": None}
    json.dumps(strict_json(value), allow_nan=False)


def test_bf16_checkpoint_as_f16_gguf_scores_exact_tensors_and_writes_strict_json(tmp_path):
    """Published weights are bf16: stored as GGUF f16 they are exact (per-tensor SNR inf), which once
    crashed the manifest writer and left the artifacts without a manifest."""
    model = build(get_preset("tiny").config, seed=3)
    with torch.no_grad():  # bf16 values f16 holds exactly (f16's normal range), as trained weights are
        for p in model.parameters():
            p.copy_(torch.where(p.abs() < 2.0**-14, 0.0, p).to(torch.bfloat16).float())
    root = _write_checkpoint(tmp_path / "ckpt", model)
    proc = cli_here("export", "spark-x2.5", "--checkpoint", str(root), "--target", "llama-cpp", "-p", "f16", "-c", "decode",
                   "--out", str(tmp_path / "out"), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = tmp_path / "out" / "spark-x2.5" / "llama-cpp"
    manifest = _strict((folder / "manifest.json").read_text())
    assert _strict(proc.stdout)["artifacts"] == manifest["artifacts"]
    (artifact,) = manifest["artifacts"]
    tensors = artifact["tensor_parity"]["tensors"]
    assert artifact["verdict"] == "pass" and artifact["tensor_parity"]["verdict"] == "pass"
    f16 = [t for t in tensors.values() if t["type"] == "F16"]
    assert f16 and all(t["snr_db"] == "inf" for t in f16), tensors  # exact: written as a string, not a crash
    assert artifact["parity"]["min_snr_db"] > artifact["parity"]["threshold_db"]  # the run itself is finite
    assert (folder / artifact["files"][0]["path"]).is_file()


def test_an_export_that_dies_at_its_manifest_leaves_nothing_that_looks_valid(tmp_path, monkeypatch):
    """Artifacts are published only after their manifest is written: a death while writing it leaves
    a fresh folder empty, and an earlier export's files and manifest as they were (consistent)."""
    args = dict(preset="tiny", components=["talker_decode"], precisions=["f16"])
    folder = tmp_path / "qwen3-tts" / "llama-cpp"
    real_write = edgex.export.write_json_atomic

    def dies(path, data):
        raise OSError("No space left on device")

    monkeypatch.setattr(edgex.export, "write_json_atomic", dies)
    with pytest.raises(EdgexError, match="cannot write the manifest .*No space left"):
        export_model("qwen3-tts", "llama-cpp", tmp_path, **args)
    assert not [p for p in folder.rglob("*")], list(folder.rglob("*"))

    monkeypatch.setattr(edgex.export, "write_json_atomic", real_write)
    first = export_model("qwen3-tts", "llama-cpp", tmp_path, **args)
    records = {r["path"]: r["sha256"] for a in first["artifacts"] for r in a["files"]}
    monkeypatch.setattr(edgex.export, "write_json_atomic", dies)
    with pytest.raises(EdgexError, match="cannot write the manifest .*No space left"):
        export_model("qwen3-tts", "llama-cpp", tmp_path, seed=1, **args)  # other weights, other bytes
    assert _strict((folder / "manifest.json").read_text())["source"] == first["source"]
    assert {str(p.relative_to(folder)): sha256(p) for p in folder.rglob("*") if p.is_file() and p.name != "manifest.json"} == records


def test_verdict_rules():
    assert combined_verdict("pass") == combined_verdict("pass", "pass", "unverified") == "pass"
    assert combined_verdict("unverified", "pass") == "unverified"  # stored tensors alone do not run it
    assert combined_verdict("unverified", None, "pass") == "pass"  # the device ran it
    assert combined_verdict("pass", "fail") == combined_verdict("unverified", None, "fail") == "fail"


def test_a_sidecar_gets_its_own_verdict_from_a_run_of_its_own_files(monkeypatch, tmp_path):
    """A sidecar nothing here runs is unverified with its reason; with --hub it goes to the device
    as its own files, and only that run passes it."""
    dlc = tmp_path / "talker_decode.fp16.dlc"
    dlc.write_bytes(b"a QNN DLC")
    sent = []

    def device(hub, component, files, io_float_dtype, local, root, compute_unit, scheme_reference, lowering_gate):
        sent.append(([f.name for f in files], local["method"], compute_unit))
        return {"method": "device", "verdict": "pass"}

    monkeypatch.setattr(edgex.export, "device_parity", device)
    component = SimpleNamespace(role="talker")
    args = (component, [dlc], None, "no QAIRT runner here", "fp16", None, None)
    local = _gate_and_place({"io_float_dtype": "float32"}, *args, None, tmp_path)
    assert local["verdict"] == "unverified" and local["parity"]["method"] == "none"
    # kept apart from verified files (unverified/), accepted or not
    assert local["parity"]["reason"] == "no QAIRT runner here" and local["files"][0]["path"] == f"unverified/{dlc.name}"
    args = (component, [tmp_path / "unverified" / dlc.name], *args[2:])
    on_device = _gate_and_place({"io_float_dtype": "float32"}, *args, edgex.export._OnDevice(object(), "npu", None), tmp_path)
    assert sent == [([dlc.name], "none", "npu")] and on_device["verdict"] == "pass"
