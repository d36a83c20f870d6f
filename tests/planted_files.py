"""Bugs planted in a written `.pte` / `.mnn` only, for the stored-quantized-tensor checks: one
layer's weight scales x2 (layer 0's down-projection), its zero points one step off (asymmetric
schemes only), one attention head of layer 0's q_proj zeroed. Each edits the file's bytes in place
where the format keeps them; the exporter is not involved. Returns False where the bug has no
meaning for the scheme (no zero points)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

DOWN = "model.layers.0.mlp.down_proj.weight"
Q = "model.layers.0.self_attn.q_proj.weight"
BUGS = ("scales x2", "zero points +1", "head zeroed")


def _head_rows(component) -> int:
    return int(component.module.get_submodule("model.layers.0.self_attn").head_dim)


def plant_pte(path: Path, component, bug: str) -> bool:
    """XNNPACK's named data: codes and scales of one weight (`edgex.exporters.xnnpack_weights`)."""
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _get_extended_header

    from edgex.exporters import EXPORTERS

    if bug == "zero points +1":
        return False  # torchao's 8da schemes are symmetric: XNNPACK stores no weight zero point
    target = DOWN if bug == "scales x2" else Q
    (weight,) = [w for _key, w, param, _module in EXPORTERS.get("executorch")._file_weights(component, [path]) if param == target]
    data = bytearray(path.read_bytes())
    header = _get_extended_header(bytes(data[:64]))
    program = _flatbuffer_to_program(bytes(data[: header.program_size]))
    segments = {n.key: program.segments[n.segment_index] for n in program.named_data}

    def span(key):
        start = header.segment_base_offset + segments[key].offset
        return start, start + segments[key].size

    if bug == "scales x2":
        a, b = span(weight.scale_key)
        if weight.group:  # bfloat16: one more on the exponent field (bits 7-14)
            data[a:b] = (np.frombuffer(bytes(data[a:b]), np.uint16) + np.uint16(1 << 7)).tobytes()
        else:
            data[a:b] = (np.frombuffer(bytes(data[a:b]), np.float32) * np.float32(2)).tobytes()
    else:  # head 0's rows: code 0 (int8 0, or the packed int4 zero 8 | 8 << 4)
        a, _ = span(weight.key)
        rows, columns = _head_rows(component), weight.weight.shape[1]
        width = columns if weight.datatype == "qcint8" else columns // 2
        data[a : a + rows * width] = bytes([0 if weight.datatype == "qcint8" else 0x88]) * (rows * width)
    path.write_bytes(bytes(data))
    return True


def plant_mnn(path: Path, component, bug: str) -> bool:
    """The (min, scale) pairs MNN stores per group of a Convolution's weights: scales x2; every
    min one step up (the asymmetric zero point off by one); head 0's groups set to min 0, scale 0."""
    from edgex.exporters import EXPORTERS
    from edgex.exporters.mnn_weights import dump, locate_vector

    target = Q if bug == "head zeroed" else DOWN
    (op,) = [op for op, _w, name, _original in EXPORTERS.get("mnn")._file_weights(component, [path]) if name == target]
    with tempfile.TemporaryDirectory() as scratch:
        model = dump(path, Path(scratch))
    conv = next(o for o in model["oplists"] if o["name"] == op)["main"]
    printed = conv["quanParameter"]["alpha"]
    data = bytearray(path.read_bytes())
    words = np.frombuffer(bytes(data), np.uint32, len(data) // 4)
    at = 4 * locate_vector(printed, words, words.view(np.float32))
    pairs = np.frombuffer(bytes(data[at : at + 4 * len(printed)]), np.float32).reshape(-1, 2).copy()  # (min, scale)
    if bug == "scales x2":
        pairs[:, 1] *= 2
    elif bug == "zero points +1":
        pairs[:, 0] += pairs[:, 1]
    else:
        per_row = len(pairs) // conv["common"]["outputCount"]
        pairs[: _head_rows(component) * per_row] = 0
    data[at : at + pairs.nbytes] = pairs.tobytes()
    path.write_bytes(bytes(data))
    return True
