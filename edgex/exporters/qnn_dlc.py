"""The QAIRT `.dlc` sidecar read back: its zip members, the weights and quantization it stores, and
the constants folded away before one is written."""

from __future__ import annotations

from pathlib import Path


# The .dlc is written by its own backend session (QAIRT's IR backend), holds its own copy of the
# weights and runs only in QAIRT's tools, so the context binary's parity does not speak for it.
DLC_UNRUN = ("the .dlc is a separate QAIRT IR build with its own weights; QAIRT's runners (qnn-net-run, SNPE) "
             "are not installable here, so nothing on this machine runs it (--hub runs it on a device)")


# Weight layouts QAIRT stores besides ONNX's own (axis orders of the ONNX initializer): MatMul
# weights [out, in]; Conv / ConvTranspose kernels channels-last, [kh, kw, in, out] (2-D) and
# [k, in, out] (1-D, which QNN runs as 2-D) or with in / out swapped for transposed convolutions.
QAIRT_LAYOUTS = {2: ((1, 0),), 3: ((2, 1, 0), (2, 0, 1)), 4: ((2, 3, 1, 0), (2, 3, 0, 1))}


def dlc_members(path: Path) -> dict[str, bytes]:
    """The members of a `.dlc`, a zip archive of stored (uncompressed) entries: the graph
    (`model`), its tensor index (`model.params`) and the tensor data (`model.params.bin`). QAIRT
    writes every member's CRC-32 as 0, so zipfile refuses to read them: each member is read raw
    from behind its local header."""
    import struct
    import zipfile

    members = {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as f:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise ValueError(f"{path.name}: member {info.filename} is compressed, expected stored")
            f.seek(info.header_offset)
            name_length, extra_length = struct.unpack("<HH", f.read(30)[26:30])
            f.seek(info.header_offset + 30 + name_length + extra_length)
            members[info.filename] = f.read(info.compress_size)
    return members


def mismatch(why: str):
    import numpy as np

    from ..parity.quantized import QuantizedTensor

    return QuantizedTensor(np.zeros((1,), np.float32), np.zeros((0,), np.float32), None, source=why)


def in_dlc(path: Path, model, tensors: dict) -> dict:
    """`tensors` (the QDQ graph's) as the `.dlc` stores them: each constant's integers must be in
    `model.params.bin` (as stored or in QAIRT's layouts) and its quantization in the graph member
    `model`, as QNN's scale-offset pair per tensor or per channel (float32 scale, then int32
    offset = -zero point; a zero point of 0 is the field's default, which the graph member leaves
    out, so there the scale alone). Measured on every per-tensor constant of two tiny LLM decode
    graphs at w8a16, w8a8 and w4a16 (uint8, uint16 and int4), and on per-channel Conv kernels,
    which the graph member holds as one 16-byte record per channel (bit width, scale, offset), each
    channel's pair found on its own: uint8 symmetric (offset -128) at w8a16 / w8a8, int4 symmetric
    (offset 0, left out) at w4a16. Then the graph's dequantized values stand for the `.dlc`'s. A
    constant missing from either fails (compared with an empty tensor)."""
    import numpy as np

    from .qdq_scheme import dequantized_constants

    members = dlc_members(path)
    data, graph = members["model.params.bin"], _Windows(members["model"])
    qdq = dequantized_constants(model)
    parameters = _scalar_parameters(model.graph)
    for name, tensor in tensors.items():
        _, q, scale, zero, axis = qdq[name]
        layouts = [q, *(q.transpose(p) for p in QAIRT_LAYOUTS.get(q.ndim, ()))]
        codes = q.size < 2 or any(data.find(np.ascontiguousarray(a).tobytes()) >= 0 for a in layouts)
        scales = graph.hold_all(_scale_offset_pairs(scale, zero))
        if codes and scales:
            continue
        if name in parameters:
            tensors[name] = unread(tensor, NOT_A_TENSOR.format(op=parameters[name]))
        elif codes and _only_zero_points(q, zero, axis):
            tensors[name] = unread(tensor, MERGED_ZEROS)
        else:
            what = " and ".join(w for w, ok in (("integers", codes), ("scales / zero points", scales)) if not ok)
            tensors[name] = mismatch(f"{what} not found in the .dlc")
    return tensors


# Two kinds of QDQ constant the `.dlc` does not store as the tensor the QDQ graph gives (measured on
# the tiny robot policies' vision encoders and DDIM loops at w8a16): a scalar that QNN's op
# definition takes as a scalar parameter (Pad's constant value: the `.dlc` holds a `pad_constant_value`
# parameter and no tensor of that name), and a constant holding only zeros (GroupNorm's zero biases
# of its InstanceNormalization nodes), which QAIRT merges with other all-zero constants into one
# record that it encodes itself (the nodes read another constant's record, under another scale).
# Neither is a weight of the model; each is listed as not read back, never as a pass.
NOT_A_TENSOR = "not stored as a tensor: QNN's {op} takes it as a scalar parameter"
MERGED_ZEROS = ("holds only zeros, which QAIRT merges with the other all-zero constants into one record under its "
                "own encoding, so its scale is not stored")
_SCALAR_PARAMETER_INPUTS = {"Pad": (2,)}  # op type -> the inputs QNN's op takes as scalar parameters


def _scalar_parameters(graph) -> dict[str, str]:
    """Dequantized scalar constants every reader of which takes them as a scalar parameter (name ->
    op type)."""
    import numpy as np

    dequantized = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    readers: dict[str, list] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in dequantized:
                readers.setdefault(dequantized[name], []).append((node.op_type, i))
    sizes = {i.name: int(np.prod(i.dims)) if i.dims else 1 for i in graph.initializer}
    return {name: uses[0][0] for name, uses in readers.items()
            if sizes.get(name, 2) < 2 and all(i in _SCALAR_PARAMETER_INPUTS.get(op, ()) for op, i in uses)}


def _only_zero_points(q, zero, axis) -> bool:
    """Whether every integer is its zero point (per tensor, or per channel along `axis`): the
    constant dequantizes to zeros whatever its scale."""
    import numpy as np

    zero = np.asarray(zero).astype(np.int64)
    if zero.size > 1:
        shape = [1] * q.ndim
        shape[axis] = -1
        zero = zero.reshape(shape)
    return bool(np.all(q.astype(np.int64) == zero))


def unread(tensor, why: str):
    """`tensor` marked as not read back from the file (`why`): scored neither pass nor fail."""
    from dataclasses import replace

    return replace(tensor, unread=why)


class _Windows:
    """Every 4- and 8-byte window of a `.dlc`'s graph member, sorted, so that whether it holds each
    of a per-channel constant's scale-offset pairs anywhere is one lookup per pair rather than a scan of
    the member per pair (a 2048-channel kernel against a 3 MB member took about 10 s by
    `bytes.find`, and a 250M-parameter U-Net's check most of its job)."""

    def __init__(self, blob: bytes):
        import numpy as np

        self._sorted = {}
        for width, dtype in ((4, np.uint32), (8, np.uint64)):
            starts = [np.frombuffer(blob, dtype, count=(len(blob) - start) // width, offset=start) for start in range(width)]
            self._sorted[width] = np.unique(np.concatenate(starts)) if starts else np.zeros(0, dtype)

    def hold_all(self, pieces: list[bytes]) -> bool:
        """Whether each of `pieces` (4 or 8 bytes each) occurs in the member (at any byte offset)."""
        import numpy as np

        for width, dtype in ((4, np.uint32), (8, np.uint64)):
            wanted, held = np.frombuffer(b"".join(p for p in pieces if len(p) == width), dtype), self._sorted[width]
            at = np.minimum(np.searchsorted(held, wanted), max(len(held) - 1, 0))
            if wanted.size and (not held.size or not np.array_equal(held[at], wanted)):
                return False
        return all(len(p) in (4, 8) for p in pieces)


def _scale_offset_pairs(scale, zero) -> list[bytes]:
    """QNN's scale-offset pair of each channel (one for a per-tensor constant) as the `.dlc`'s graph
    member stores it: float32 scale, then int32 offset = -zero point, the offset left out where it
    is 0 (the field's default)."""
    import numpy as np

    scales = np.asarray(scale, np.float32).reshape(-1)
    zeros = np.broadcast_to(np.asarray(zero).reshape(-1).astype(np.int64), scales.shape)
    return [s.tobytes() + (np.int32(-z).tobytes() if z else b"") for s, z in zip(scales, zeros)]


FOLDED = ("unverified: read only by nodes whose inputs are all constants, which ONNX Runtime folds into new constants "
          "before QAIRT writes the .dlc (so the tensor is not stored as given); the context binary's parity run covers them")


def folded_constants(graph) -> set[str]:
    """Initializers every reader of which computes from constants only (looking through
    DequantizeLinear): ONNX Runtime's constant folding, on in the session that writes a QDQ graph's
    .dlc, evaluates such nodes, and QAIRT stores their results, not these inputs. Measured on a
    one-pass action policy whose first decoder layer starts from a constant zero query: its
    self-attention and norm1 are input-independent, and its fp16 .dlc written with constant folding
    on held neither norm1's weight nor the constants around it; written with it off, as the fp16
    .dlc is (`half_weights`), it holds all six as given."""
    constant = {i.name for i in graph.initializer}
    for node in graph.node:  # topological order
        if all(not i or i in constant for i in node.input):
            constant.update(node.output)
    readers: dict[str, list] = {}
    for node in graph.node:
        for i in node.input:
            readers.setdefault(i, []).append(node)

    def folded(name: str) -> bool:
        nodes = readers.get(name, [])
        return bool(nodes) and all(folded(n.output[0]) if n.op_type == "DequantizeLinear" else
                                   all(not i or i in constant for i in n.input) for n in nodes)

    return {i.name for i in graph.initializer if folded(i.name)}


# The inputs at which QNN's op takes a weight as a computed tensor as readily as a constant: an
# fp16 `.dlc` stores these weights in fp16, each behind one Cast to float32 that every reader (every
# step of an unrolled graph) shares. Transpose is one: torch's export transposes a linear layer's
# weight at each call, and onnxscript folds that Transpose into a new initializer only where the
# weight has at most 8192 elements or one reader, so an unrolled graph's larger weights reach QNN
# as one Transpose per step. Other float constants (norm weights, scalars, a BatchNorm's
# statistics, Resize scales) stay float32: QNN takes several of them only as constants, and they are
# a small part of a graph's bytes.
HALF_READERS = {"MatMul": (0, 1), "Gemm": (0, 1, 2), "Gather": (0,), "Conv": (1, 2), "ConvTranspose": (1, 2), "Transpose": (0,)}


def half_weight_names(graph) -> set[str]:
    """The float32 initializers (of 2 or more elements) an fp16 `.dlc` stores in fp16: those every
    reader of which takes them at one of its `HALF_READERS` inputs."""
    from onnx import TensorProto

    readers: dict[str, list] = {}
    for node in graph.node:
        for i, name in enumerate(node.input):
            readers.setdefault(name, []).append((node.op_type, i))
    return {init.name for init in graph.initializer
            if init.data_type == TensorProto.FLOAT and _elements(init) >= 2 and init.name in readers
            and all(i in HALF_READERS.get(op, ()) for op, i in readers[init.name])}


def _elements(init) -> int:
    size = 1
    for d in init.dims:
        size *= d
    return size


def half_weights(source: Path, dest: Path) -> Path:
    """`source` (an fp32 graph) written to `dest` as QAIRT's IR backend is to write an fp16 `.dlc`
    from: each of its `half_weight_names` stored as fp16 (rounded to nearest) behind one Cast to
    float32, and initializers of identical bytes merged into one (`merged_duplicates`). The backend
    stores each constant in the dtype the graph gives it, and each initializer apart: written from
    the fp32 graph as it is, a `.dlc` holds fp32 weights (twice the fp16 context binary) and an
    unrolled graph's weights once per step (torch's export folds each step's transposed weight into
    an initializer of its own: a tiny 15-step graph's 346 initializers hold 150 distinct tensors).
    The session writing the `.dlc` must not fold constants (`htp_session(fold_constants=False)`),
    or ONNX Runtime turns each Cast back into a float32 constant. The graph computes what the HTP
    runs at fp16 precision, whose weights are the same fp16 values."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.load(str(source))
    half = half_weight_names(model.graph)
    merged_duplicates(model.graph, half)
    casts = []
    for init in model.graph.initializer:
        if init.name in half:
            array = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array(array.astype("float16"), f"{init.name}.fp16"))
            casts.append(helper.make_node("Cast", [init.name], [init.name.removesuffix(".fp16")], to=TensorProto.FLOAT,
                                          name=f"{init.name}.cast"))
    nodes = casts + list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    onnx.save(model, str(dest), save_as_external_data=True, all_tensors_to_one_file=True, location=f"{dest.name}.data")
    return dest


def merged_duplicates(graph, half: set[str]) -> int:
    """Merge initializers of the same dtype, shape and bytes (and the same `half` membership, so each
    weight keeps the dtype the `.dlc` check looks for) into the first of them: the others are
    removed and their readers read it. Initializers a subgraph or a graph output names are left as
    they are. Returns how many were merged."""
    import hashlib

    from onnx import numpy_helper

    pinned = {o.name for o in graph.output} | {name for node in graph.node for sub in _subgraphs(node) for name in _read_in(sub)}
    first, rename = {}, {}
    for init in graph.initializer:
        if init.name in pinned:
            continue
        array = numpy_helper.to_array(init)
        key = (init.name in half, array.dtype.str, array.shape, hashlib.sha256(array.tobytes()).digest())
        if key in first:
            rename[init.name] = first[key]
        else:
            first[key] = init.name
    if not rename:
        return 0
    kept = [i for i in graph.initializer if i.name not in rename]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name in rename:
                node.input[k] = rename[name]
    return len(rename)


def _subgraphs(node) -> list:
    from onnx import AttributeProto

    return [g for a in node.attribute for g in ([a.g] if a.type == AttributeProto.GRAPH else a.graphs if a.type == AttributeProto.GRAPHS else [])]


def _read_in(graph) -> set[str]:
    """Every name a graph's nodes read, its subgraphs' included."""
    return {name for node in graph.node for name in node.input} | {n for node in graph.node for sub in _subgraphs(node) for n in _read_in(sub)}


# How much larger than the runnable files it sits beside (context binary + EPContext model) a
# `.dlc` may be. Both hold the graph's weights once in fp16 (or the QDQ graph's integers), so a
# faithful `.dlc` is about their size: measured 0.93-1.03 x on the tiny presets (the rest is each
# file's own graph and layout: an unrolled 15-step graph's .dlc 9.4 MB beside 9.1 MB, a ResNet
# policy's w8a16 .dlc 11.5 MB beside 11.4 MB). One holding its weights twice (fp32, or once per
# unrolled step) is 1.8 x or more. A folder whose every artifact has a `.dlc` is then about twice
# its runnable bytes, and at most 2.25 times.
DLC_SIZE_LIMIT = 1.25


def oversized(dlc: Path, runnable_bytes: int) -> str | None:
    """Why a `.dlc` is not kept beside its artifact, or None: one more than `DLC_SIZE_LIMIT` times
    the runnable files it is another build of holds weights it should not (twice, or wider than the
    artifact's), and it is not written. The reason goes in the artifact's manifest entry
    (`sidecars_not_written`)."""
    size = dlc.stat().st_size
    if size <= DLC_SIZE_LIMIT * runnable_bytes:
        return None
    return (f"not written: QAIRT's IR backend wrote a {size / 1e6:.1f} MB .dlc, {size / runnable_bytes:.2f} x the "
            f"{runnable_bytes / 1e6:.1f} MB of the context binary and EPContext model it is another build of (at most "
            f"{DLC_SIZE_LIMIT:g} x: a .dlc holding its weights once is about their size)")
