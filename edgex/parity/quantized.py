"""Stored quantized tensors: every quantized weight a written file holds, dequantized from the file,
scored against `edgex.parity.quantizer`'s quantization of the eager weight it stands for.

A quantized artifact's model parity compares it with a reference that runs some scheme; if that
scheme is read from the file, a wrong tensor in the file is on both sides. Here each tensor is
checked on its own, at export and again in `edgex verify`, against a quantizer that shares no code
with the exporter (`parity/quantizer.py`). Three figures per tensor:

- `agreement_db`: the file's tensor against the independent quantization of the eager weight. The
  schemes are deterministic, so a faithful file agrees exactly (inf) or to float rounding (ONNX
  Runtime's int4 blocks: 146.8 dB on a Gaussian weight); a tensor below `AGREEMENT_DB` fails. One
  layer's scales x2 scores ~0 dB, zero points off by one 20-35 dB, one head zeroed ~3-10 dB.
- `snr_db`: the file's tensor against the eager weight, i.e. what the scheme reached;
- `expected_snr_db`: the independent quantization against the eager weight, what it should reach.

One failing tensor fails the artifact, and the summary names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import metrics
from .quantizer import WeightScheme, fake_quantize

# A faithful file reproduces the independent quantizer's codes exactly (measured: inf dB, or 146.8
# dB where the format multiplies by a reciprocal in float); a scale off by 1 % scores ~40 dB, one
# zero point off by one step in an 8-bit row ~33 dB. 60 dB sits far from both.
AGREEMENT_DB = 60.0


@dataclass
class QuantizedTensor:
    """One quantized tensor of a file: `stored` dequantized from the file and `original` the eager
    weight it was made from, both as rows of output channels reduced along the last axis (the
    layout `scheme` quantizes). `scheme` None: the format stores the tensor in fp16 (a fallback for
    rows that are not whole blocks), checked as fp16 rounding. `fixed`: what the tensor must hold
    where that is not a scheme of its own (a bias quantized at a scale derived from other tensors'),
    named by `scheme_name`. `source` says where `stored` was read. `unread`: why the file holds no
    copy of this tensor to read back (a constant the format takes another way); such a tensor is
    neither a pass nor a failure, and its block is then unverified."""

    stored: np.ndarray
    original: np.ndarray
    scheme: WeightScheme | None
    source: str = "file"
    fixed: np.ndarray | None = None
    scheme_name: str | None = None
    unread: str | None = None


def expected(tensor: QuantizedTensor) -> np.ndarray:
    if tensor.fixed is not None:
        return tensor.fixed
    if tensor.scheme is None:
        return np.asarray(tensor.original, np.float32).astype(np.float16).astype(np.float32)
    return fake_quantize(tensor.original, tensor.scheme)


def score(tensor: QuantizedTensor) -> dict:
    if tensor.unread is not None:
        return {"unverified": tensor.unread, "verdict": "unverified"}
    if tensor.original.size == 0:
        why = tensor.source if tensor.source != "file" else "stands for no weight of the component"
        return {"error": why, "agreement_db": -math.inf, "verdict": "fail"}
    if tensor.stored.shape != tensor.original.shape:
        return {"error": f"shape {list(tensor.stored.shape)} != eager {list(tensor.original.shape)}", "agreement_db": -math.inf,
                "verdict": "fail"}
    want = expected(tensor)
    figures = {"scheme": tensor.scheme_name or (tensor.scheme.name if tensor.scheme else "float16"), "shape": list(tensor.original.shape),
               "agreement_db": metrics.snr_db(want, tensor.stored), "snr_db": metrics.snr_db(tensor.original, tensor.stored),
               "expected_snr_db": metrics.snr_db(tensor.original, want),
               "per": f"block of {tensor.scheme.block}" if tensor.scheme and tensor.scheme.block else "row"}
    if tensor.source != "file":
        figures["source"] = tensor.source
    ok = figures["agreement_db"] >= AGREEMENT_DB  # NaN fails too
    figures["verdict"] = "pass" if ok else "fail"
    return figures


def _problem(figures: dict) -> str:
    if "error" in figures:
        return figures["error"]
    return f"{figures['agreement_db']:.1f} dB from the independent {figures['scheme']} quantization (< {AGREEMENT_DB:.0f} dB)"


def quantized_parity(exporter, component, files: list[Path], precision: str, options: dict | None = None) -> dict | None:
    """The manifest's `quantized_parity` block for one entry's files, or None where the files store
    no quantized weight (`Exporter.stored_quantized`)."""
    found = exporter.stored_quantized(component, files, precision, **(options or {}))
    if found is None:
        return None
    if isinstance(found, str):  # the format's quantized weights cannot be read here: unverified, never a pass
        return {"verdict": "unverified", "unverified": found, "tensors": {}}
    tensors = {name: score(t) for name, t in found.items()}
    failures = [f"{name}: {_problem(t)}" for name, t in tensors.items() if t["verdict"] == "fail"]
    unread = {name: t["unverified"] for name, t in tensors.items() if t["verdict"] == "unverified"}
    if len(unread) == len(tensors):
        failures.append(f"no quantized tensor found in {files[0].name}")
    agreements = [t["agreement_db"] for t in tensors.values() if "agreement_db" in t]
    expected_snrs = [t["expected_snr_db"] for t in tensors.values() if "expected_snr_db" in t]
    block = {"threshold_db": AGREEMENT_DB, "tensors_checked": len(tensors) - len(unread),
             "min_agreement_db": min(agreements) if agreements else None,
             "expected_snr_db": {"min": min(expected_snrs), "median": float(np.median(expected_snrs))} if expected_snrs else None,
             "verdict": "fail" if failures else "unverified" if unread else "pass", "failures": failures, "tensors": tensors}
    if unread and not failures:
        name, why = next(iter(unread.items()))
        block["unverified"] = (f"{len(unread)} quantized constant(s) not read back from {files[0].name}, e.g. {name}: {why}")
    return block


def summary(block: dict | None) -> str | None:
    """One line for a failing block, naming the worst tensor."""
    if not block or block["verdict"] != "fail":
        return None
    return f"stored quantized tensor {block['failures'][0]}" + (f" (+{len(block['failures']) - 1} more)" if len(block["failures"]) > 1 else "")


def blockwise(array: np.ndarray, scale_shape: tuple) -> tuple[np.ndarray, int | None]:
    """`array` as rows the quantizer reduces along, given the shape of the scales a file stores for
    it (broadcastable against it): axes the scales follow one to one are rows (output channels),
    an axis they cover in blocks is moved last with the fully reduced axes after it, so each block
    is contiguous. Returns (rows, values per scale; None for one scale per row)."""
    array = np.asarray(array, np.float32)
    shape = array.shape
    scale_shape = (1,) * (len(shape) - len(scale_shape)) + tuple(int(d) for d in scale_shape)
    rows = [a for a, (d, s) in enumerate(zip(shape, scale_shape)) if s == d and d > 1]
    blocked = [a for a, (d, s) in enumerate(zip(shape, scale_shape)) if 1 < s < d]
    reduced = [a for a in range(len(shape)) if a not in rows and a not in blocked]
    if len(blocked) > 1 or any(shape[a] % scale_shape[a] for a in blocked):
        raise ValueError(f"scales of shape {scale_shape} do not block a tensor of shape {shape} along one axis")
    moved = array.transpose(rows + blocked + reduced)
    count = math.prod(shape[a] for a in rows)
    block = None
    if blocked:
        block = shape[blocked[0]] // scale_shape[blocked[0]] * math.prod(shape[a] for a in reduced)
    return moved.reshape(count, -1), block


def paired_by_content(stored: dict[str, np.ndarray], candidates: dict[str, np.ndarray], samples: int = 4096) -> dict[str, tuple[str, bool] | None]:
    """For a file that does not name its weights (XNNPACK's named data is keyed by a hash of the
    bytes, MNN's converter names ops after ONNX nodes), the eager tensor each stored tensor holds:
    among `candidates` of the same element count, the one whose values point the same way as the
    stored ones (cosine similarity, blind to scale, so a tensor stored with doubled scales or a
    zeroed head is still paired with its own weight and then fails its check; among equal
    cosines, such as constant columns, the closest in value), as laid out or,
    for a 2-D candidate, transposed. Returns (candidate name, transposed), or None where no
    candidate has the element count. Compared on `samples` evenly spaced positions: unrelated
    Gaussian weights score ~1/sqrt(samples), a tensor and its quantization ~1. Pairing says which
    weight a file holds, not where its graph reads it; the model parity run covers that."""
    flat = {}
    for name, array in candidates.items():
        array = np.asarray(array, np.float32)
        flat.setdefault(array.size, []).append((name, array))
    result = {}
    for key, array in stored.items():
        array = np.asarray(array, np.float32)
        pick = np.linspace(0, array.size - 1, min(samples, array.size)).astype(np.int64)
        mine = array.reshape(-1)[pick]
        best, best_score = None, (-2.0, 0.0)
        for name, candidate in flat.get(array.size, []):
            layouts = [(False, candidate.reshape(-1)[pick])]
            if array.ndim == 2 and candidate.ndim == 2 and candidate.shape[::-1] == array.shape:
                rows, columns = np.divmod(pick, array.shape[1])
                layouts.append((True, candidate[columns, rows]))  # the same positions of the transpose, not copied whole
            for transposed, theirs in layouts:
                norm = float(np.linalg.norm(mine) * np.linalg.norm(theirs))
                cosine = float(mine @ theirs) / norm if norm > 0 else float(np.array_equal(mine, theirs))
                # candidates pointing the same way (constant columns, a norm's ones): the closest in value
                score = (round(cosine, 3), -float(np.mean((mine - theirs) ** 2)))
                if score > best_score:
                    best, best_score = (name, transposed), score
        result[key] = best
    return result
