"""Fault injection: corrupt the weights inside each written format AFTER hashing (the file is changed
and its sha256/bytes rewritten in manifest.json, so the hash check passes) and show that the parity
re-run of `edgex verify` catches it: a non-zero exit, and the corrupted artifact's figure far below
both its gate and its export figure.

One small component (talker_decode) per format, one export per target (module-scoped; the files of
the CPU, MNN and llama-cpp targets are those of the suite's exports of those targets, conftest.py's
`cpu_export`, `mnn_export` and `gguf_export`, copied), one `edgex verify` per target. Weights are located exactly where a reader exists (onnx external data, gguf tensors); in
the other files (.pte, .mnn, QNN context binary, Core ML weight.bin) the eager
`codec_head` weight is found by its bytes, and the middle half of its region is negated and scaled
x4 in the file's own dtype, so the files stay parseable and the numerical gate is what fails them.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import cli_here, gguf_export, mnn_export, run_cli, subset_folder
from edgex.artifacts.files import sha256

pytestmark = pytest.mark.xdist_group("fault_injection")  # one module fixture: exports built once

COMPONENT = "talker_decode"
TARGETS = {
    "qnn": ("-t", "s25-htp"),
    "apple": ("-p", "fp16"),
}
# The targets whose files come from a shared export: its talker_decode entries at these precisions.
SHARED = {"mnn": (mnn_export, ("fp32",)), "llama-cpp": (gguf_export, ("f16", "q8_0"))}
SCALE = -4.0  # weights negated and scaled: a corruption no gate can mistake for rounding


def _strict(text: str):
    def refuse(constant):
        raise ValueError(f"non-strict JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


def _scale(path: Path, offset: int, count: int, dtype) -> None:
    """Multiply `count` values of `dtype` at byte `offset` of `path` by SCALE, in place."""
    with open(path, "r+b") as f:
        f.seek(offset)
        values = np.frombuffer(f.read(count * np.dtype(dtype).itemsize), dtype)
        f.seek(offset)
        f.write((values.astype(np.float32) * SCALE).astype(dtype).tobytes())


def _locate(path: Path, weight: np.ndarray, dtype, needle: int) -> tuple[int, int]:
    """Byte range in `path` holding `weight` (row-major, stored as `dtype`): found by searching
    `needle`-element runs at 50 places along the weight (an HTP binary keeps only pairs of a row
    together). Returns the first and last hit."""
    data = path.read_bytes()
    flat = weight.ravel()
    hits = [data.find(flat[i:i + needle].astype(dtype).tobytes()) for i in range(0, flat.size - needle, flat.size // 50)]
    found = sorted(h for h in hits if h >= 0)
    assert len(found) >= 40, f"{path.name}: the weight's bytes were not found ({len(found)} of {len(hits)} runs)"
    return found[0], found[-1]


def _corrupt_located(path: Path, weight: np.ndarray, dtype, needle: int = 16) -> None:
    """Scale the middle half of the weight's region in the file."""
    first, last = _locate(path, weight, dtype, needle)
    size = np.dtype(dtype).itemsize
    start = first + (last - first) // 4 // size * size
    _scale(path, start, (last - first) // 2 // size, dtype)


def _corrupt_onnx_data(model: Path) -> str:
    """Scale the middle half of the largest external initializer, located by onnx's own reader."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    spans = []
    for init in graph.initializer:
        info = {e.key: e.value for e in init.external_data}
        if init.data_location == onnx.TensorProto.EXTERNAL and init.data_type == onnx.TensorProto.FLOAT:
            spans.append((int(info["length"]), int(info.get("offset", 0)), info["location"], init.name))
    length, offset, location, name = max(spans)
    _scale(model.parent / location, offset + length // 4 // 4 * 4, length // 2 // 4, np.float32)
    return name


def _corrupt_gguf_tensor(path: Path, name: str) -> None:
    """Dequantize one stored tensor with gguf's reader, scale the middle half of its rows, quantize
    it back to its own type and write it over the same bytes."""
    from gguf import GGUFReader, quants

    tensor = next(t for t in GGUFReader(str(path)).tensors if t.name == name)
    values = np.array(quants.dequantize(tensor.data, tensor.tensor_type), np.float32)
    rows = values.shape[0]
    values[rows // 4: 3 * rows // 4] *= SCALE
    data = quants.quantize(values, tensor.tensor_type)
    assert data.nbytes == tensor.n_bytes
    with open(path, "r+b") as f:
        f.seek(tensor.data_offset)
        f.write(data.tobytes())


def _rehash(root: Path) -> None:
    """Rewrite every file record of the manifest to the files' current sha256 and size."""
    path = root / "manifest.json"
    manifest = _strict(path.read_text())
    for entry in manifest["artifacts"]:
        for record in entry["files"]:
            record.update(sha256=sha256(root / record["path"]), bytes=(root / record["path"]).stat().st_size)
    path.write_text(json.dumps(manifest, indent=2))


@pytest.fixture(scope="module")
def codec_head():
    """The eager weight the talker graphs end in (3072 x hidden, their largest)."""
    from edgex.recipes import RECIPES

    loaded = RECIPES.get("qwen3-tts").load("tiny", None, 0)
    return loaded.models.talker.codec_head.weight.detach().numpy()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Export on first use, per target: {target: (folder, manifest)}."""
    done = {}

    def get(target: str):
        if target in SHARED and target not in done:
            export, precisions = SHARED[target]
            out, proc = export()
            assert proc.returncode == 0, proc.stderr[-3000:]
            keep = lambda a: a["component"] == COMPONENT and a["precision"] in precisions  # noqa: E731
            done[target] = subset_folder(out / "qwen3-tts" / target, keep, tmp_path_factory.mktemp(f"fault-{target}"))
        if target not in done:
            out = tmp_path_factory.mktemp(f"fault-{target}")
            args = TARGETS[target] if "-t" in TARGETS[target] else ("-t", target, *TARGETS[target])
            proc = cli_here("export", "qwen3-tts", *args, "--preset", "tiny", "-c", COMPONENT, "--out", str(out), "--json")
            manifest = json.loads(proc.stdout)
            assert all(a["verdict"] in ("pass", "unverified") for a in manifest["artifacts"]), proc.stderr[-3000:]
            done[target] = (out / "qwen3-tts" / manifest["target"], manifest)
        return done[target]
    return get


def _tamper_and_verify(exported, target: str, corrupt, tmp_path: Path) -> tuple[dict, dict, object]:
    """A copy of the target's export with `corrupt(folder)` applied and the hashes rewritten, then
    `edgex verify --json` on it: (export manifest, verify report, process)."""
    source, manifest = exported(target)
    folder = tmp_path / target
    shutil.copytree(source, folder)
    corrupt(folder)
    _rehash(folder)
    proc = cli_here("verify", str(folder), "--json")
    report = _strict(proc.stdout)
    for row in report["artifacts"]:  # the hashes match: only parity can have caught it
        assert row["files"] == "ok", row
    return manifest, report, proc


def _row(report: dict, fmt: str, precision: str) -> dict:
    return next(r for r in report["artifacts"] if r["format"] == fmt and r["precision"] == precision)


def _entry(manifest: dict, fmt: str, precision: str) -> dict:
    return next(a for a in manifest["artifacts"] if a["format"] == fmt and a["precision"] == precision)


def _db(value) -> float:
    return float(value) if isinstance(value, str) else value


def _assert_parity_caught(manifest, report, fmt, precision):
    """Export passed well above the gate; verify re-ran it and it fell far below."""
    before = _entry(manifest, fmt, precision)["parity"]
    row = _row(report, fmt, precision)
    assert before["min_snr_db"] >= before["threshold_db"]
    assert row["verdict"] == "fail" and row["method"] == before["method"], row
    after = _db(row["min_snr_db"])
    assert after < row["threshold_db"] and after < before["min_snr_db"] - 20, (before["min_snr_db"], after)
    assert re.search(r"min SNR -?[\d.]+ dB below the [\d.]+ dB gate", row["problem"]), row["problem"]
    print(f"{fmt} {precision}: {before['min_snr_db']:.1f} dB at export -> {after:.1f} dB after corruption (gate {row['threshold_db']:.0f})")


def _cpu_export_of_the_component(cpu_export, folder: Path) -> tuple[Path, dict]:
    """The component's .pte and ONNX fp32 artifacts of the suite's CPU export, in `folder` with a
    manifest of those entries alone."""
    out, proc = cpu_export
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder, manifest = subset_folder(out / "qwen3-tts" / "cpu", lambda a: a["component"] == COMPONENT and a["precision"] == "fp32", folder)
    assert {a["format"] for a in manifest["artifacts"]} == {"pte", "onnx"}
    return folder, manifest


def test_corrupted_pte_and_onnx_weights_fail_verify(cpu_export, codec_head, tmp_path):
    def corrupt(folder):
        _corrupt_located(folder / f"{COMPONENT}.fp32.pte", codec_head, np.float32)
        _corrupt_onnx_data(folder / f"{COMPONENT}.fp32.onnx")

    export = _cpu_export_of_the_component(cpu_export, tmp_path / "export")
    manifest, report, proc = _tamper_and_verify(lambda _target: export, "cpu", corrupt, tmp_path)
    assert proc.returncode == 1 and "verification failed: 2 problem(s)" in proc.stderr
    _assert_parity_caught(manifest, report, "pte", "fp32")
    _assert_parity_caught(manifest, report, "onnx", "fp32")


def test_corrupted_mnn_weights_fail_verify(exported, codec_head, tmp_path):
    manifest, report, proc = _tamper_and_verify(
        exported, "mnn", lambda folder: _corrupt_located(folder / f"{COMPONENT}.fp32.mnn", codec_head, np.float32), tmp_path)
    assert proc.returncode == 1
    _assert_parity_caught(manifest, report, "mnn", "fp32")


def test_corrupted_qnn_context_binary_and_dlc_fail_verify(exported, codec_head, tmp_path):
    """The HTP binary keeps pairs of fp16 weights together (its own tiling): found by pairs; its
    parity run fails. The .dlc, which nothing here runs (its entry stays method `none`), fails on
    its stored tensors: every weight of the graph it was written from must be in it byte for byte
    (the weights in fp16, as the ONNX graph's MatMul reads them: [hidden, 3072])."""
    def corrupt(folder):
        (binary,) = folder.glob(f"{COMPONENT}.fp16*.bin")
        _corrupt_located(binary, codec_head, np.float16, needle=2)
        _corrupt_located(folder / "unverified" / f"{COMPONENT}.fp16.dlc", np.ascontiguousarray(codec_head.T), np.float16)  # kept apart

    manifest, report, proc = _tamper_and_verify(exported, "qnn", corrupt, tmp_path)
    assert proc.returncode == 1 and "verification failed: 2 problem(s)" in proc.stderr
    _assert_parity_caught(manifest, report, "qnn-context", "fp16")
    before = _entry(manifest, "qnn-dlc", "fp16")
    assert before["verdict"] == "unverified" and before["tensor_parity"]["verdict"] == "pass", before
    dlc = _row(report, "qnn-dlc", "fp16")
    assert dlc["verdict"] == "fail" and dlc["method"] == "none" and "qnn-net-run" in dlc["reason"], dlc
    assert "stored tensor" in dlc["problem"] and _db(dlc["tensor_min_snr_db"]) == -math.inf, dlc


def test_corrupted_mlpackage_weights_fail_verify(exported, codec_head, tmp_path):
    weights = f"{COMPONENT}.fp16.mlpackage/Data/com.apple.CoreML/weights/weight.bin"
    manifest, report, proc = _tamper_and_verify(
        exported, "apple", lambda folder: _corrupt_located(folder / weights, codec_head, np.float16), tmp_path)
    assert proc.returncode == 1
    _assert_parity_caught(manifest, report, "mlpackage", "fp16")


def test_corrupted_gguf_fails_verify_also_in_weights_no_run_reads(exported, tmp_path):
    """f16: the token embedding table, which the parity run (fed embeddings) never reads: model
    parity is unchanged, the re-read stored tensor fails. q8_0: the output head, which the run
    reads: model parity itself fails."""
    def corrupt(folder):
        _corrupt_gguf_tensor(folder / f"{COMPONENT}.f16.gguf", "token_embd.weight")
        _corrupt_gguf_tensor(folder / f"{COMPONENT}.q8_0.gguf", "output.weight")

    manifest, report, proc = _tamper_and_verify(exported, "llama-cpp", corrupt, tmp_path)
    assert proc.returncode == 1 and "verification failed: 2 problem(s)" in proc.stderr
    _assert_parity_caught(manifest, report, "gguf", "q8_0")
    embd = _row(report, "gguf", "f16")
    before = _entry(manifest, "gguf", "f16")
    assert embd["verdict"] == "fail" and math.isclose(_db(embd["min_snr_db"]), before["parity"]["min_snr_db"], abs_tol=1e-6)
    assert "stored tensor token_embd.weight" in embd["problem"] and _db(embd["tensor_min_snr_db"]) < embd["threshold_db"]
    print(f"gguf f16 token_embd: tensor {before['tensor_parity']['min_snr_db']:.1f} dB at export -> "
          f"{_db(embd['tensor_min_snr_db']):.1f} dB after corruption; model parity {_db(embd['min_snr_db']):.1f} dB unchanged")


TABLE_TARGETS = {  # the other formats' readers: (export arguments, file suffix holding the table, its dtype)
    "mnn": (("-t", "mnn", "-p", "fp32"), ".mnn", np.float32),
    "apple": (("-t", "apple", "-p", "fp16"), "weight.bin", np.float16),
    "qnn": (("-t", "s25-htp", "-p", "fp16"), "_qnn.bin", np.float16),
}


@pytest.mark.benchmark  # three more exports of the predictor step (minutes); ONNX and .pte: test_verify.py
@pytest.mark.parametrize("target", list(TABLE_TARGETS))
def test_an_embedding_row_no_sample_reads_fails_verify(target, tmp_path):
    """The predictor step's table row 30719, which no parity sample reads, negated and scaled x4 in
    the written file (.mnn Const, Core ML weight.bin, HTP context binary; hashes rewritten): the
    runtime parity is unchanged and passes, verify fails the artifact on that row."""
    from edgex.recipes import RECIPES

    args, suffix, dtype = TABLE_TARGETS[target]
    proc = run_cli("export", "qwen3-tts", *args, "--preset", "tiny", "-c", "code_predictor_step", "--out", str(tmp_path), "--json")
    manifest = json.loads(proc.stdout)
    (entry,) = [a for a in manifest["artifacts"] if "sidecar_of" not in a]
    assert entry["verdict"] == "pass" and entry["tensor_parity"]["verdict"] == "pass", entry.get("tensor_parity")
    loaded = RECIPES.get("qwen3-tts").load("tiny", None, 0)
    (component,) = RECIPES.get("qwen3-tts").components(loaded, ["code_predictor_step"])
    row = component.tables["stacked_codec_embedding"].detach().numpy()[-1]
    root = tmp_path / "qwen3-tts" / manifest["target"]
    (path,) = [root / r["path"] for r in entry["files"] if r["path"].endswith(suffix)]
    raw = path.read_bytes()
    at = raw.index(row.astype(dtype).tobytes())
    path.write_bytes(raw[:at] + (row * SCALE).astype(dtype).tobytes() + raw[at + row.astype(dtype).nbytes:])
    _rehash(root)
    proc = run_cli("verify", str(root), "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    result = _row(_strict(proc.stdout), entry["format"], entry["precision"])
    assert result["files"] == "ok" and result["method"] == entry["parity"]["method"], result
    assert _db(result["min_snr_db"]) >= result["threshold_db"], result
    assert result["verdict"] == "fail" and "stored tensor stacked_codec_embedding (row 30719)" in result["problem"], result
    print(f"{target}: parity {_db(result['min_snr_db']):.1f} dB (passes), table {_db(result['tensor_min_snr_db']):.1f} dB")
