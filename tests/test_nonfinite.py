"""A NaN or inf fails `edgex export` and `edgex verify`, with a one-line reason that says so.

Four places a non-finite value can sit, each planted in a real export of a tiny component (in this
process, so the planted fault is a monkeypatch) and then verified from the written folder:
a stored gather-table row (GGUF's `token_embd`, which no parity run reads, and an ONNX table),
one output of one sample (the ONNX Runtime session's), and the eager reference itself. Before
NaN counted as a failure, a NaN row scored NaN dB, was counted below no gate and passed; an inf in
the reference made an SNR of NaN that Python's `min` skipped."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from edgex.cli import app
from edgex.exporters import EXPORTERS
from edgex.parity.runtimes import RUNTIMES
from edgex.recipes import RECIPES

pytestmark = pytest.mark.xdist_group("nonfinite")


def _cli(*args: str):
    return CliRunner().invoke(app, list(args))


def _export(tmp_path, component: str, *args: str):
    result = _cli("export", "qwen3-tts", "--preset", "tiny", "-c", component, *args, "--out", str(tmp_path), "--json")
    manifest = json.loads(result.stdout)
    (entry,) = manifest["artifacts"]
    return result, entry, tmp_path / "qwen3-tts" / manifest["target"]


def _verify(folder):
    result = _cli("verify", str(folder), "--json")
    (row,) = json.loads(result.stdout)["artifacts"]
    return result, row


def _nan_row_after_export(monkeypatch, exporter: str, table, row: int, dtype) -> None:
    """The exporter's files, once written, with `table`'s row `row` (found by its bytes in the
    file's own dtype) overwritten with NaN."""
    kind = type(EXPORTERS.get(exporter))
    export = kind.export
    stored = np.asarray(table[row], np.float32).astype(dtype).tobytes()

    def export_then_corrupt(self, component, precision, dest, **options):
        result = export(self, component, precision, dest, **options)
        (path,) = [p for p in result.files if stored in p.read_bytes()]
        raw = path.read_bytes()
        at = raw.index(stored)
        path.write_bytes(raw[:at] + np.full(len(table[row]), np.nan, dtype).tobytes() + raw[at + len(stored):])
        return result

    monkeypatch.setattr(kind, "export", export_then_corrupt)


def _assert_fails_export_and_verify(tmp_path, component, export_args, reason: str, monkeypatch_verify=None):
    result, entry, folder = _export(tmp_path, component, *export_args)
    assert result.exit_code == 1, result.output[-3000:]
    assert entry["verdict"] == "fail"
    (line,) = [line for line in result.stderr.splitlines() if "parity gate failed" in line]
    assert reason in line, line
    if monkeypatch_verify:
        monkeypatch_verify()
    result, row = _verify(folder)
    assert result.exit_code == 1 and row["files"] == "ok" and row["verdict"] == "fail", row
    assert reason in row["problem"], row["problem"]
    return entry, row


def test_a_nan_row_in_a_stored_gguf_table_fails(tiny, monkeypatch, tmp_path):
    """Row 3 of `token_embd` (the talker graph is fed embeddings: no run reads it) is NaN in the
    written f16 file; the model parity run still passes."""
    table = tiny[1]["talker_decode"].layouts["gguf"].tensors()["token_embd.weight"]
    _nan_row_after_export(monkeypatch, "gguf", table, 3, np.float16)
    entry, row = _assert_fails_export_and_verify(tmp_path, "talker_decode", ("-t", "llama-cpp", "-p", "f16"),
                                                 "stored tensor token_embd.weight (row 3) holds NaN / inf")
    assert entry["parity"]["verdict"] == "pass" and entry["tensor_parity"]["verdict"] == "fail"
    assert entry["tensor_parity"]["tensors"]["token_embd.weight"]["rows_below_gate"] == 1


def test_a_nan_row_in_a_stored_onnx_table_fails(tiny, monkeypatch, tmp_path):
    """The predictor step's stacked table, its last row (no sample reads it), NaN in the ONNX data."""
    table = tiny[1]["code_predictor_step"].tables["stacked_codec_embedding"].detach().numpy()
    last = table.shape[0] - 1
    _nan_row_after_export(monkeypatch, "onnx", table, last, np.float32)
    entry, _ = _assert_fails_export_and_verify(tmp_path, "code_predictor_step", ("-f", "onnx", "-p", "fp32"),
                                               f"stored tensor stacked_codec_embedding (row {last}) holds NaN / inf")
    assert entry["parity"]["verdict"] == "pass"


def _nan_in_second_sample(monkeypatch):
    """ONNX Runtime sessions whose second call returns one NaN in its second output."""
    kind = type(RUNTIMES.get("onnxruntime"))
    load = kind.load

    def loaded(self, files, threads=None):
        session, calls = load(self, files, threads), []
        run = session.run

        def nan_once(inputs):
            outputs = [np.array(o) for o in run(inputs)]
            calls.append(1)
            if len(calls) == 2:
                outputs[1].reshape(-1)[5] = np.nan
            return outputs

        session.run = nan_once
        return session

    monkeypatch.setattr(kind, "load", loaded)


def test_a_nan_in_one_output_of_one_sample_fails(monkeypatch, tmp_path):
    _nan_in_second_sample(monkeypatch)
    entry, _ = _assert_fails_export_and_verify(
        tmp_path, "talker_decode", ("-f", "onnx", "-p", "fp32"),
        "utterance_b_frame30: hidden: 1 NaN / inf value(s) of 64 where the reference is finite")
    assert entry["parity"]["failures"][0].startswith("utterance_b_frame30: hidden: 1 NaN")


def _inf_in_reference(monkeypatch):
    """The talker decode's eager reference with one inf in its logits on the second sample."""
    recipe_type = type(RECIPES.get("qwen3-tts"))
    build = recipe_type.components

    def planted(component):
        second = list(component.samples.values())[1]

        def reference(*inputs):
            outputs = list(component.reference(*inputs))
            if all(a is b for a, b in zip(inputs, second)):
                outputs[0] = outputs[0].clone()
                outputs[0].reshape(-1)[7] = float("inf")
            return tuple(outputs)

        return replace(component, reference=reference, _reference_outputs={})

    build_each = recipe_type.iter_components
    monkeypatch.setattr(recipe_type, "components", lambda self, loaded, names=None: [planted(c) for c in build(self, loaded, names)])
    monkeypatch.setattr(recipe_type, "iter_components", lambda self, loaded, names=None: map(planted, build_each(self, loaded, names)))


def test_an_inf_in_a_reference_fails(monkeypatch, tmp_path):
    _inf_in_reference(monkeypatch)
    entry, _ = _assert_fails_export_and_verify(tmp_path, "talker_decode", ("-f", "onnx", "-p", "fp32"),
                                               "utterance_b_frame30: logits: the reference holds 1 NaN / inf value(s)")
    assert entry["parity"]["min_snr_db"] == "-inf"
