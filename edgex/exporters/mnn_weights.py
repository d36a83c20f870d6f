"""The quantized weights a `.mnn` stores, read back from the file.

MNN's Python API runs a `.mnn` but does not expose the weights inside its Convolution ops. MNN's
own converter writes the whole model out as JSON (`-f MNN --JsonFile`, its `MNNDump2Json`), each
Convolution's `quanParameter` (`IDSTQuan`) included; this module decodes that as MNN's loader
does (`ConvolutionCommon::load`, `IDSTDecoder::ReadQuanData_c`):

- `buffer`, `type` 1 (dense): the shape (a count byte, then each dimension as uint16, or uint32
  where `shapeInt32`), the count of distinct codes (one byte, 0 meaning 256), the codes themselves
  (signed bytes, sorted ascending by the loader), then one index per weight into that sorted table,
  packed most significant bit first in ceil(log2(count)) bits. `type` 4: the int8 codes as they are.
  Sparse (`type` 2) and indexed (`index`) weights are not read here: a file holding one is reported
  unreadable, never guessed.
- `alpha` (float32 in the file; the JSON prints 6 decimal places, so each vector is taken
  from the file itself: the flatbuffer vector, a uint32 length followed by the floats, 4-byte
  aligned, whose values the JSON's round to): for asymmetric weights (`readType` != 0) one (min, scale) pair per group of consecutive
  weights, value = code x scale + (min - clampMin x scale), clampMin = `aMin` (or -128 where 0);
  otherwise one scale per group, value = code x scale. Both x `quantScale`.

The JSON holds each weight byte as text: the dump is ~4x the file, read once per check.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..artifacts.files import sha256


@dataclass
class MnnWeight:
    """One quantized Convolution weight: `weight` the flat weight buffer as MNN dequantizes it,
    laid out [outputCount, rest] (rest: inputs x kernel in the ONNX layout the converter read);
    `group` weights per scale (None: one per output channel)."""

    op: str
    weight: np.ndarray
    group: int | None


def _shape(data: bytes, at: int, int32: bool) -> tuple[list[int], int]:
    count = data[at]
    width = 4 if int32 else 2
    dims = np.frombuffer(data, np.uint32 if int32 else np.uint16, count, at + 1).tolist()
    return dims, at + 1 + count * width


def _dense_codes(data: bytes, int32: bool) -> np.ndarray:
    dims, at = _shape(data, 0, int32)
    count = math.prod(dims)
    table_size = data[at] or 256
    table = np.sort(np.frombuffer(data, np.int8, table_size, at + 1).astype(np.int32))
    at += 1 + table_size
    bits = max(1, math.ceil(math.log2(table_size)))
    packed = np.frombuffer(data, np.uint8, math.ceil(bits * count / 8), at)
    indices = np.unpackbits(packed)[: bits * count].reshape(count, bits)
    indices = (indices.astype(np.int32) << np.arange(bits - 1, -1, -1)).sum(axis=1)
    if indices.size and indices.max() >= table_size:
        raise ValueError(f"an index {int(indices.max())} past the {table_size} codes stored")
    return table[indices]


def locate_vector(printed: list, words: np.ndarray, floats: np.ndarray) -> int:
    """Where (in 4-byte words) the file's float32 vector that `printed` (the JSON dump, 6 decimal
    places) rounds begins: a uint32 length equal to its size, then values within half a printed unit."""
    want = np.asarray(printed, np.float32)
    n = want.size
    for at in np.flatnonzero(words[: words.size - n] == n):
        if np.allclose(floats[at + 1 : at + 1 + n], want, rtol=1e-6, atol=6e-7):
            return int(at) + 1
    raise ValueError(f"a scale vector of {n} values printed by the JSON dump is not in the file")


def decode(quan: dict, output_count: int, file: tuple[np.ndarray, np.ndarray] | None = None,
           kept: tuple[bytes, np.ndarray] | None = None) -> tuple[np.ndarray, int | None]:
    """A `quanParameter` (as MNN's JSON dump writes it) dequantized: (weights [output_count, -1],
    weights per scale or None). `file`: the `.mnn` as uint32 words and float32 values, where the
    exact `alpha` is taken from. `kept`: the buffer and `alpha` as the weight file beside the
    `.mnn` holds them, for an op whose data the converter wrote there (`external`)."""
    if quan.get("index"):
        raise ValueError("indexed sparse weights are not read here")
    data = kept[0] if kept else np.asarray(quan.get("buffer", []), np.int64).astype(np.uint8).tobytes()
    kind = quan.get("type", 0)
    if kind == 1:
        codes = _dense_codes(data, bool(quan.get("shapeInt32")))
    elif kind == 4:
        codes = np.frombuffer(data, np.int8).astype(np.int32)
    else:
        raise ValueError(f"weight coding type {kind} is not read here")
    alpha = kept[1] if kept else np.asarray(quan.get("alpha", []), np.float32)
    if file is not None and not kept:
        at = locate_vector(alpha.tolist(), *file)
        alpha = file[1][at : at + alpha.size].copy()
    asymmetric = quan.get("readType", 0) != 0
    groups = alpha.size // 2 if asymmetric else alpha.size
    if groups == 0 or codes.size % groups:
        raise ValueError(f"{codes.size} weights do not split into {groups} scale groups")
    codes = codes.reshape(groups, -1).astype(np.float32)
    factor = np.float32(quan.get("quantScale", 1.0))
    if asymmetric:
        clamp = np.float32(quan.get("aMin") or -128)
        low, scale = alpha[0::2, None], alpha[1::2, None]
        values = codes * (scale * factor) + (low - clamp * scale) * factor
    else:
        values = codes * (alpha[:, None] * factor)
    per = codes.shape[1]
    values = values.reshape(output_count, -1)
    return values, (per if per < values.shape[1] else None)


def dump(path: Path, scratch: Path) -> dict:
    """The `.mnn` as MNN's converter writes it to JSON."""
    from .mnn_converter import run_converter

    out = scratch / "model.json"
    run_converter(["MNNConvert", "-f", "MNN", "--modelFile", str(path.resolve()), "--JsonFile", str(out)], out)
    return json.loads(out.read_text())


# The last file read, by its bytes' sha256: an export reads one file's weights twice (its scheme
# and its stored-tensor check), and the converter's JSON dump is most of the cost of each read.
_LAST_READ: dict[str, dict[str, MnnWeight]] = {}


def quantized_weights(path: Path, weights: Path | None = None) -> dict[str, MnnWeight]:
    """Every Convolution op of the `.mnn` whose weights are stored quantized, by op name; `weights`:
    the file beside it holding the data of its ops the converter wrote there (`external`)."""
    raw = path.read_bytes()
    digest = hashlib.sha256(raw + (sha256(weights).encode() if weights else b"")).hexdigest()
    if digest not in _LAST_READ:
        _LAST_READ.clear()
        _LAST_READ[digest] = _read_quantized(path, raw, weights)
    return dict(_LAST_READ[digest])


def _read_quantized(path: Path, raw: bytes, weights: Path | None) -> dict[str, MnnWeight]:
    found = {}
    with tempfile.TemporaryDirectory(prefix="mnnjson-") as scratch:
        model = dump(path, Path(scratch))
    words = np.frombuffer(raw, np.uint32, len(raw) // 4)
    file = (words, words.view(np.float32))
    data = np.memmap(weights, np.uint8, mode="r") if weights else None
    for op in model.get("oplists", []):
        main = op.get("main") or {}
        quan = main.get("quanParameter") if op.get("main_type") == "Convolution2D" else None
        if not quan or quan.get("type") == 3:  # 3: fp16 storage, not quantized
            continue
        kept = None
        if "external" in main:  # [offset, buffer bytes, alpha bytes, ...]: the buffer, then alpha
            if data is None:
                raise ValueError(f"{op['name']}'s weights are kept outside the .mnn, and there is no weight file beside it")
            offset, size, alpha = main["external"][:3]
            kept = (bytes(data[offset:offset + size]), np.frombuffer(data[offset + size:offset + size + alpha], np.float32).copy())
        weight, group = decode(quan, main["common"]["outputCount"], file, kept)
        found[op["name"]] = MnnWeight(op["name"], weight, group)
    return found


# MNN's blob data types, as its JSON dump names them, for the constants read from a weight file.
_BLOB_DTYPES = {"DT_FLOAT": np.float32, "DT_HALF": np.float16, "DT_INT32": np.int32, "DT_INT8": np.int8, "DT_UINT8": np.uint8}


def external_constants(path: Path, weights: Path) -> dict[str, np.ndarray]:
    """The `Const` ops of a `.mnn` whose data the converter wrote to `weights` (the file beside it,
    `mnn.external_weights`), by op name: MNN's expression API (`load_as_dict`) does not read those
    (`read()` fails). The JSON dump gives each one's data type, dims and `external` [offset, bytes]
    in that file, read as it lies there."""
    with tempfile.TemporaryDirectory(prefix="mnnjson-") as scratch:
        model = dump(path, Path(scratch))
    data = np.memmap(weights, np.uint8, mode="r")
    found = {}
    for op in model.get("oplists", []):
        blob = op.get("main") or {}
        dtype = _BLOB_DTYPES.get(blob.get("dataType"))
        if op.get("type") != "Const" or dtype is None:
            continue
        if "external" in blob:
            offset, size = blob["external"][:2]
            found[op["name"]] = np.frombuffer(data[offset:offset + size], dtype).reshape(blob.get("dims") or [-1]).copy()
    return found
