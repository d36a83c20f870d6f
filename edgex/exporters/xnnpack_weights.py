"""The quantized weights a `.pte` holds inside its XNNPACK delegates, read back from the file.

An XNNPACK delegate's payload (`BackendDelegateDataReference`, in a data segment or inline) is
XNNPACK's own header (`XNNHeader`) and an `XNNGraph` flatbuffer. The graph does not carry the
weights: each constant is a `ConstantDataOffset` whose `named_key` names an entry of the program's
`named_data`, a data segment of the file. A quantized weight is an `XNNQuantizedTensorValue`:
codes under its `constant_buffer_idx`, scales under its quantization parameters'
`scale_buffer_idx`. How ExecuTorch writes them (`backends/xnnpack/operators/node_visitor.py`):

- `qcint8`: int8 codes, row-major [out, in], one float32 scale per output channel, zero point 0;
- `qcint4` / `qbint4`: codes + 8 packed two per byte along the input (the even input in the low
  nibble, `convert_to_qc4w`); one float32 scale per output channel (`qcint4`), or one bfloat16
  scale per `group_size` inputs of a row (`qbint4`: `PerChannelGroupQuant` scales are cast to
  bfloat16 when written).

The graph flatbuffer is decoded by `flatc` with XNNPACK's schema, both as ExecuTorch ships them
(as its own flat-tensor reader does); the program by ExecuTorch's deserializer. Both are ExecuTorch's
private functions, read through `edgex.patches.executorch.program_file`.
"""

from __future__ import annotations

import json
import mmap
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..patches.executorch import flatc_decompile, program_file

_CODES = {"xnn_datatype_qcint8": 8, "xnn_datatype_qcint4": 4, "xnn_datatype_qbint4": 4}


@dataclass
class XnnpackWeight:
    """One quantized weight of a delegate, dequantized as XNNPACK reads it: [out, in] float32.
    `group`: inputs per scale (None: one scale per output channel); `key` / `scale_key`: the named
    data keys of its codes and its scales."""

    key: str
    scale_key: str
    datatype: str
    weight: np.ndarray
    group: int | None


def program_segments(path: Path):
    """The `.pte`'s program (ExecuTorch's deserializer, on the flatbuffer only) and `segment(index)`,
    a data segment's bytes from a memory map of the file (None: a file without data segments)."""
    with open(path, "rb") as f:
        view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    header, program = program_file(view)
    if header is None:
        return program, None

    def segment(index: int) -> memoryview:
        located = program.segments[index]
        start = header.segment_base_offset + located.offset
        return view[start : start + located.size]

    return program, segment


def _graph(blob: bytes, scratch: Path) -> dict:
    """An XNNPACK payload's `XNNGraph` as JSON (flatc with the schema ExecuTorch ships)."""
    import importlib.resources

    import executorch.backends.xnnpack.serialization as serialization
    from executorch.backends.xnnpack.serialization.xnnpack_graph_serialize import XNNHeader

    header = XNNHeader.from_bytes(blob[: XNNHeader.EXPECTED_LENGTH])
    schema = scratch / "schema.fbs"
    if not schema.exists():
        schema.write_bytes((importlib.resources.files(serialization) / "schema.fbs").read_bytes())
    graph = scratch / "graph.bin"
    graph.write_bytes(blob[header.flatbuffer_offset : header.flatbuffer_offset + header.flatbuffer_size])
    flatc_decompile(str(scratch), str(schema), str(graph))
    return json.loads((scratch / "graph.json").read_text())


def _unpack4(packed: np.ndarray, rows: int, columns: int) -> np.ndarray:
    """Codes packed two per byte along a row (the even column in the low nibble), offset 8 removed."""
    pairs = packed.reshape(rows, -1)
    codes = np.stack([pairs & 0x0F, pairs >> 4], axis=-1).reshape(rows, -1)[:, :columns]
    return codes.astype(np.int32) - 8


def _bfloat16(raw: bytes) -> np.ndarray:
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32)


def quantized_weights(path: Path) -> dict[str, XnnpackWeight]:
    """Every quantized (int8 / int4) weight of every XNNPACK delegate of the `.pte`, once per pair of
    codes and scales (partitions that read the same weight share its named data)."""
    from executorch.exir.schema import DataLocation

    program, segment = program_segments(path)
    if segment is None:
        raise ValueError(f"{path.name} has no data segments, where XNNPACK's weights are kept")
    named = {entry.key: entry.segment_index for entry in program.named_data or []}
    found: dict[str, XnnpackWeight] = {}
    with tempfile.TemporaryDirectory(prefix="xnngraph-") as scratch:
        for plan in program.execution_plan:
            for delegate in plan.delegates:
                if delegate.id != "XnnpackBackend":
                    continue
                ref = delegate.processed
                blob = bytes(segment(ref.index)) if ref.location == DataLocation.SEGMENT else program.backend_delegate_data[ref.index].data
                graph = _graph(blob, Path(scratch))
                constants = graph["constant_data"]
                for value in graph["xvalues"]:
                    if value["xvalue_union_type"] != "XNNQuantizedTensorValue":
                        continue
                    tensor, params = value["xvalue_union"]["tensor_value"], value["xvalue_union"]["quant_params"]
                    bits = _CODES.get(tensor["datatype"])
                    if bits is None or tensor["constant_buffer_idx"] == 0:
                        continue  # activations (dynamically quantized at run time), or no stored data
                    key, scale_key = constants[tensor["constant_buffer_idx"]]["named_key"], constants[params["scale_buffer_idx"]]["named_key"]
                    if f"{key}/{scale_key}" in found:
                        continue
                    if params.get("channel_dim", 0) != 0 or tensor["num_dims"] != 2:
                        raise ValueError(f"quantized weight {key[:12]}: channel axis {params.get('channel_dim')} of "
                                         f"{tensor['num_dims']} dims, not read here")
                    rows, columns = tensor["dims"]
                    raw = bytes(segment(named[key]))
                    codes = (np.frombuffer(raw, np.int8).reshape(rows, columns).astype(np.int32) if bits == 8
                             else _unpack4(np.frombuffer(raw, np.uint8), rows, columns))
                    group = params.get("group_size") if value["xvalue_union"]["quant_params_type"] == "PerChannelGroupQuant" else None
                    scale_raw = bytes(segment(named[scale_key]))
                    scales = _bfloat16(scale_raw) if group else np.frombuffer(scale_raw, np.float32)
                    scales = scales.reshape(rows, -1)
                    per = np.repeat(scales, group, axis=1)[:, :columns] if group else scales
                    found[f"{key}/{scale_key}"] = XnnpackWeight(key, scale_key, tensor["datatype"].removeprefix("xnn_datatype_"),
                                                                (codes * per).astype(np.float32), group)
    return found
