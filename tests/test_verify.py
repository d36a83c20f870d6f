"""`edgex verify` re-runs parity from a manifest and catches tampered or truncated artifacts."""

import json
import shutil

import numpy as np
import pytest

from conftest import built_once, cli_here, cpu_export_artifacts, subset_folder
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
    """One run covers both sides: the untouched artifacts re-pass in their runtimes, the two
    tampered ones (a flipped byte, a truncation) fail."""
    tampered = tmp_path / "cpu"
    shutil.copytree(export_copy, tampered)
    data = tampered / "talker_decode.fp32.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # one flipped byte, same size
    data.write_bytes(bytes(raw))
    pte = tampered / "latent2wav.fp32.pte"
    pte.write_bytes(pte.read_bytes()[:1000])
    proc = cli_here("verify", str(tampered), "--json")
    assert proc.returncode == 1
    assert "verification failed: 2 problem(s)" in proc.stderr
    report = json.loads(proc.stdout)
    bad = {(a["component"], a["format"], a["precision"]): a["problem"] for a in report["artifacts"] if a["verdict"] != "pass"}
    assert set(bad) == {("talker_decode", "onnx", "fp32"), ("latent2wav", "pte", "fp32")}
    assert "sha256" in bad[("talker_decode", "onnx", "fp32")]
    assert "bytes" in bad[("latent2wav", "pte", "fp32")]
    good = [a for a in report["artifacts"] if a["verdict"] == "pass"]
    assert len(good) == len(cpu_export_artifacts(ROLES)) - 2 and all(a["files"] == "ok" and a["method"] == "runtime" for a in good)
    assert all(a["min_snr_db"] >= a["threshold_db"] for a in good)


def _silence_layer0_mlp(model) -> None:
    """Layer 0's MLP silenced: its norm weight, a named initializer, zeroed."""
    from onnx import numpy_helper

    (weight,) = [t for t in model.graph.initializer if t.name == "model.layers.0.post_attention_layernorm.weight"]
    weight.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(weight)), weight.name))


def _swap_layer_caches(model) -> None:
    """Layers 0 and 1 read each other's slice of a sliced cache input (`edgex.sliced_inputs`): what a
    runtime adapter feeding the per-layer inputs out of order would compute."""
    sliced = json.loads({p.key: p.value for p in model.metadata_props}["edgex.sliced_inputs"])
    name = next(iter(sliced))
    swap = {f"{name}.0": f"{name}.1", f"{name}.1": f"{name}.0"}
    for node in model.graph.node:
        node.input[:] = [swap.get(i, i) for i in node.input]


@pytest.fixture(scope="module")
def spark_decode_onnx():
    """Spark-X2.5's decode step as ONNX fp32, exported once for every worker; it passed its gate (exit 0)."""

    def make(out):
        proc = cli_here("export", "spark-x2.5", "--preset", "tiny", "-c", "decode", "-f", "onnx", "-p", "fp32",
                       "--out", str(out), "--json")
        assert proc.returncode == 0, proc.stderr[-3000:]

    return built_once("spark-decode-onnx", make) / "spark-x2.5" / "cpu"


@pytest.mark.parametrize("tamper", [_silence_layer0_mlp, _swap_layer_caches], ids=["mlp-silenced", "layer-caches-swapped"])
def test_verify_parity_catches_a_tampered_onnx_whose_manifest_hashes_were_updated(spark_decode_onnx, tmp_path, tamper):
    """Hashes are not the only line: the ONNX file tampered with inside (`tamper`), the manifest's
    sha256 and sizes rewritten to match, and verify's re-run parity still fails it. The untampered
    export passed its gate."""
    import onnx

    root = tmp_path / "cpu"
    shutil.copytree(spark_decode_onnx, root)
    manifest = json.loads((root / "manifest.json").read_text())
    (entry,) = manifest["artifacts"]
    path = root / entry["files"][0]["path"]
    model = onnx.load(str(path))
    tamper(model)
    data = [r["path"] for r in entry["files"] if r["path"] != entry["files"][0]["path"]]
    onnx.save(model, str(path), save_as_external_data=bool(data), all_tensors_to_one_file=True,
              location=data[0].split("/")[-1] if data else None)
    entry["files"] = [record for r in entry["files"] for record in file_records(root / r["path"], root)]
    (root / "manifest.json").write_text(json.dumps(manifest))

    proc = cli_here("verify", str(root), "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["artifacts"]
    assert row["files"] == "ok" and row["method"] == "runtime", row  # the hashes match: parity caught it
    assert row["verdict"] == "fail" and "dB gate" in row["problem"] and "below the" in row["problem"], row
    assert row["min_snr_db"] < row["threshold_db"] - 20, row


def _step_rows_read(component) -> set[int]:
    """Rows of the predictor step's stacked table its parity samples read: step s >= 1 embeds code
    s-1 from rows (s-1) * vocab + code."""
    vocab = component.module.vocab
    return {max(int(step) - 1, 0) * vocab + int(code) for _, code, step, *_ in component.samples.values()}


def _codebook_rows_read(component) -> set[int]:
    """Rows of the last codebook (code 15 of each frame) code2latent's parity samples read."""
    return {int(c) for codes, *_ in component.samples.values() for c in codes[0, -1]}


# component -> (table, rows its parity samples read, formats and precisions the suite's CPU export writes)
_TABLES = {"code_predictor_step": ("stacked_codec_embedding", _step_rows_read, {(f, p) for f in ("pte", "onnx") for p in ("fp32", "fp16")}),
           "code2latent": ("quantizer.rvq_rest.vq.layers.14._codebook", _codebook_rows_read, {("pte", "fp32"), ("onnx", "fp32"), ("onnx", "fp16")})}


def test_verify_reads_back_embedding_rows_no_parity_sample_reads(export_copy, tiny, tmp_path):
    """The predictor step's parity samples read 3 of its table's 30720 rows, code2latent's 75 of
    its last codebook's 2048. One row they do not read is negated and scaled x4 inside each written
    file (.pte constant segment and ONNX data, fp32 and fp16; hashes rewritten): every runtime
    parity figure is unchanged and passes, and verify fails each artifact on that row, read back
    from the file by the format's own reader."""
    root = tmp_path / "cpu"
    shutil.copytree(export_copy, root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["artifacts"] = [a for a in manifest["artifacts"] if a["component"] in _TABLES]
    rows = {}
    for name, (table_name, rows_read, written) in _TABLES.items():
        component = tiny[1][name]
        table = component.tables[table_name].detach().numpy()
        rows[name] = max(set(range(table.shape[0])) - rows_read(component))
        assert {(a["format"], a["precision"]) for a in manifest["artifacts"] if a["component"] == name} == written
    for entry in manifest["artifacts"]:
        name = entry["component"]
        assert entry["tensor_parity"]["verdict"] == "pass", entry["tensor_parity"]  # the faithful export read every row back
        table = tiny[1][name].tables[_TABLES[name][0]].detach().numpy()
        dtype = np.float16 if entry["precision"] == "fp16" else np.float32
        stored = table[rows[name]].astype(dtype).tobytes()
        (path,) = [root / r["path"] for r in entry["files"] if stored in (root / r["path"]).read_bytes()]
        raw = path.read_bytes()
        at = raw.index(stored)
        path.write_bytes(raw[:at] + (table[rows[name]] * -4).astype(dtype).tobytes() + raw[at + len(stored):])
        entry["files"] = [record for r in entry["files"] for record in file_records(root / r["path"], root)]
    (root / "manifest.json").write_text(json.dumps(manifest))

    proc = cli_here("verify", str(root), "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert len(report["artifacts"]) == 7
    for result, entry in zip(report["artifacts"], manifest["artifacts"]):
        name = entry["component"]
        assert result["files"] == "ok" and result["method"] == "runtime", result
        assert abs(result["min_snr_db"] - entry["parity"]["min_snr_db"]) < 1 and result["min_snr_db"] >= result["threshold_db"]
        assert result["verdict"] == "fail" and f"stored tensor {_TABLES[name][0]} (row {rows[name]})" in result["problem"], result
        assert result["tensor_min_snr_db"] < 0, result


def test_verify_and_pipeline_refuse_a_checkpoint_that_is_not_the_one_exported(tmp_path):
    """Both rebuild the eager model from the manifest's checkpoint path: a folder whose content no
    longer has the sha256 the export recorded is refused in one line before anything is built."""
    import json

    from edgex.artifacts.files import sha256
    from edgex.artifacts.keys import tree_sha256
    from edgex.errors import EdgexError
    from edgex.in_situ import run_pipeline
    from edgex.verify import verify_directory

    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "a.onnx").write_bytes(b"graph")
    entry = {"component": "talker_decode", "format": "onnx", "exporter": "onnx", "precision": "fp32", "verdict": "pass",
             "io_float_dtype": "float32", "parity": {}, "files": [{"path": "a.onnx", "sha256": sha256(folder / "a.onnx"), "bytes": 5}]}
    source = {"checkpoint": str(checkpoint), "checkpoint_sha256": tree_sha256(checkpoint)}
    (folder / "manifest.json").write_text(json.dumps({"model": "qwen3-tts", "target": "cpu", "source": source, "artifacts": [entry]}))
    (checkpoint / "config.json").write_text('{"edited": true}')
    with pytest.raises(EdgexError, match="is not the one exported"):
        verify_directory(folder)
    with pytest.raises(EdgexError, match="is not the one exported"):
        run_pipeline([folder])


def test_verify_fails_a_negated_waveform_its_spectral_figure_cannot_see(cpu_export, tmp_path):
    """latent2wav's `wav` output (the streaming decoder's vocoder half, ONNX fp32 of the suite's CPU
    export) multiplied by -1 inside the ONNX graph, the manifest's hashes rewritten: the spectral
    figure (blind to phase by design) still reads it as identical, the waveform's correlation with
    the reference (-1) fails it. The faithful export passed."""
    import onnx
    from onnx import helper

    out, proc = cpu_export
    assert proc.returncode == 0, proc.stderr[-3000:]
    is_latent2wav = lambda a: (a["component"], a["format"], a["precision"]) == ("latent2wav", "onnx", "fp32")  # noqa: E731
    root, manifest = subset_folder(out / "qwen3-tts" / "cpu", is_latent2wav, tmp_path)
    (entry,) = manifest["artifacts"]
    faithful = json.loads(json.dumps(entry))
    assert faithful["verdict"] == "pass", faithful["parity"]["failures"]
    path = root / entry["files"][0]["path"]
    model = onnx.load(str(path))
    (wav,) = [o for o in model.graph.output if o.name == "wav"]
    for node in model.graph.node:
        node.output[:] = ["wav_unnegated" if o == "wav" else o for o in node.output]
    model.graph.node.append(helper.make_node("Neg", ["wav_unnegated"], ["wav"], name="negate_wav"))
    data = [r["path"] for r in entry["files"] if r["path"] != entry["files"][0]["path"]]
    onnx.save(model, str(path), save_as_external_data=bool(data), all_tensors_to_one_file=True,
              location=data[0].split("/")[-1] if data else None)
    entry["files"] = [record for r in entry["files"] for record in file_records(root / r["path"], root)]
    (root / "manifest.json").write_text(json.dumps(manifest))

    proc = cli_here("verify", str(root), "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    (row,) = json.loads(proc.stdout)["artifacts"]
    assert row["files"] == "ok" and row["method"] == "runtime", row
    assert row["min_snr_db"] >= row["threshold_db"], "the spectral figure passes a negated waveform"
    assert row["min_waveform_correlation"] == pytest.approx(-1.0, abs=1e-3) and row["min_waveform_snr_db"] < -5.0, row
    assert row["verdict"] == "fail" and "waveform correlation -1.000" in row["problem"], row
    assert (row["gate"]["figure"], row["gate"]["check"]) == ("end-to-end", "waveform correlation"), row["gate"]
    assert faithful["parity"]["min_waveform_correlation"] > 0.99, faithful["parity"]
