"""Qualcomm HTP context binaries (+ QNN IR `.dlc`) from the component's ONNX graph.

The shape AI Hub calls "precompiled_qnn_onnx": an EPContext `.onnx` that points at a QNN context
binary `.bin` compiled offline for one SoC / HTP architecture, which ONNX Runtime's QNN execution
provider loads on the phone without recompiling. Beside it, the same graph through QAIRT's IR backend
as a `.dlc` for QAIRT's own tools: a sidecar with its own manifest entry, as nothing here runs it.

Precisions: `fp16` runs the float graph in half precision on the HTP. The quantized schemes are
static QDQ graphs made by ONNX Runtime's QNN quantizer, calibrated on activations the recipe draws
from the eager pipeline (`Component.calibration`), never on the parity samples.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import logging
import os
import shutil
import tempfile
import weakref
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EdgexError
from ..qnn import htp_session, plugin_version, qairt_version
from . import EXPORTERS
from .base import ExportResult, Exporter, Sidecar, StoredTensor
from .onnx import OnnxExporter, drop_unread_initializers, nodes_from_modules

if TYPE_CHECKING:
    from ..component import Component

# scheme -> (weight type, activation type) as onnxruntime.quantization.QuantType names. `per_channel`
# applies to Conv / ConvTranspose kernels only: QNN's MatMul takes no per-channel weights, so the QNN
# quantizer config gives every MatMul weight one scale (measured: all 21 uint8 weights of a tiny LLM
# decode graph at w8a16 per tensor; a gather's table takes the activation type, uint16 per tensor).
_FLOAT_OPS = ("Sqrt", "Reciprocal")
_SCHEMES = {"w8a16": ("QUInt8", "QUInt16"), "w4a16": ("QInt4", "QUInt16"), "w8a8": ("QUInt8", "QUInt8")}
# Weight types quantized symmetric (zero point 0) where ONNX Runtime's QNN config would make them
# asymmetric. The HTP mis-lowers int4 weights with a non-zero zero point: a tiny LLM decode graph's
# asymmetric int4 QDQ graph (zero points in -8 ... 7) scored 3.7 dB in the HTP simulator against
# the same graph on ONNX Runtime CPU (its key cache output; 19-20 dB the others),
# the same graph with symmetric int4 weights 39-41 dB (20.6 dB on the value cache, where the
# activation leaves its calibrated range, as at w8a16). Per-channel kernels are symmetric whatever this says.
_SYMMETRIC_WEIGHTS = ("QInt4",)
# The .dlc is written by its own backend session (QAIRT's IR backend), holds its own copy of the
# weights and runs only in QAIRT's tools, so the context binary's parity does not speak for it.
DLC_UNRUN = ("the .dlc is a separate QAIRT IR build with its own weights; QAIRT's runners (qnn-net-run, SNPE) "
             "are not installable here, so nothing on this machine runs it (--hub runs it on a device)")

# Weight layouts QAIRT stores besides ONNX's own (axis orders of the ONNX initializer): MatMul
# weights [out, in]; Conv / ConvTranspose kernels channels-last, [kh, kw, in, out] (2-D) and
# [k, in, out] (1-D, which QNN runs as 2-D) or with in / out swapped for transposed convolutions.
_QAIRT_LAYOUTS = {2: ((1, 0),), 3: ((2, 1, 0), (2, 0, 1)), 4: ((2, 3, 1, 0), (2, 3, 0, 1))}

QDQ_DIGEST = "edgex.qdq_graph_sha256"  # EPContext metadata: the QDQ graph the context binary was compiled from


@contextmanager
def _calibration_on_one_thread():
    """Calibration as every export runs it (in a job's forked process, on one thread), whatever this
    process's thread count: `edgex verify` makes the QDQ graph again and refuses one whose digest
    differs, and a reduction split over another number of threads (the eager model's activations,
    ONNX Runtime's calibration session) can move a calibration range in its last bits. torch runs on
    one thread and ONNX Runtime's calibrator session (`CalibraterBase.create_inference_session`,
    which takes no session options) is made with one intra- and one inter-op thread."""
    import onnxruntime
    import torch
    from onnxruntime.quantization.calibrate import CalibraterBase

    def one_thread(self):
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL  # as the calibrator's own
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self.infer_session = onnxruntime.InferenceSession(self.augmented_model_path, sess_options=options,
                                                          providers=self.execution_providers)

    threads, made = torch.get_num_threads(), CalibraterBase.create_inference_session
    torch.set_num_threads(1)
    CalibraterBase.create_inference_session = one_thread
    try:
        yield
    finally:
        CalibraterBase.create_inference_session = made
        torch.set_num_threads(threads)


def quantize_qdq(source: Path, dest: Path, component: Component, precision: str, size: int) -> dict:
    """Static QDQ quantization for the HTP, calibrated on `size` input sets from the eager pipeline,
    on one thread (`_calibration_on_one_thread`)."""
    with _calibration_on_one_thread():
        return _quantize_qdq(source, dest, component, precision, size)


def _quantize_qdq(source: Path, dest: Path, component: Component, precision: str, size: int) -> dict:
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    if component.calibration is None:
        raise EdgexError(f"{component.name} provides no calibration data, which {precision} needs")
    sets = component.calibration(size)
    names = [s.name for s in component.inputs]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._feeds = iter([{n: t.numpy() for n, t in zip(names, inputs)} for inputs in sets])

        def get_next(self):
            return next(self._feeds, None)

    weights, activations = _SCHEMES[precision]
    source = _own_biases(source, dest)
    float_only = nodes_from_modules(source, component.float_only)
    htp_fp16 = _fp16_on_htp(source) + sampling_nodes(source, component)
    config = get_qnn_qdq_config(str(source), Reader(), activation_type=getattr(QuantType, activations),
                                weight_type=getattr(QuantType, weights), per_channel=True,
                                weight_symmetric=True if weights in _SYMMETRIC_WEIGHTS else None,
                                nodes_to_exclude=float_only + htp_fp16 or None)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer advises pre-processing through the root logger
    try:
        quantize(str(source), str(dest), config)
    finally:
        root.setLevel(level)
    return {"calibration_sets": len(sets), "calibration_method": "minmax", "weights": weights, "activations": activations,
            "float_only": {"patterns": list(component.float_only), "nodes": float_only}, "fp16_nodes": len(htp_fp16)}


# Ops whose input 2 ONNX Runtime's QDQ quantizer quantizes as a bias (scale from inputs 0 and 1).
_BIAS_OPS = ("Conv", "ConvTranspose", "Gemm", "InstanceNormalization", "LayerNormalization", "BatchNormalization")


def _own_biases(source: Path, dest: Path) -> Path:
    """`source`, or a copy beside it in which every bias initializer read by more than one node
    is one initializer per node (same values, names `<bias>.edgex_bias<i>`).

    ONNX Runtime's quantizer gives each reader of a shared bias its own copy itself, named
    `<bias><n>` for the next free number among initializers only (`_dup_initializer`): with
    torch.onnx's `val_<n>` names that can be an existing activation's name. A diffusion
    policy's unrolled DDIM loop reads GroupNorm's constant bias `val_16` from 64 InstanceNormalization
    nodes, the copy `val_1636` took the name of a Reshape output, and quantization stopped with
    "Quantization parameter shared mode is not supported for weight yet"; where no error follows,
    the node reads that activation as its bias (tests/test_qnn.py)."""
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, list] = {}
    for node in graph.node:
        if node.op_type in _BIAS_OPS and len(node.input) > 2 and node.input[2] in inits:
            readers.setdefault(node.input[2], []).append(node)
    shared = {name: nodes for name, nodes in readers.items() if len(nodes) > 1}
    if not shared:
        return source
    for name, nodes in shared.items():
        for i, node in enumerate(nodes):
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[name])
            copy.name = f"{name}.edgex_bias{i}"
            graph.initializer.append(copy)
            node.input[2] = copy.name
    drop_unread_initializers(graph, set(shared))
    # beside the source, so external-data locations (relative to the model's folder) stay valid
    owned = source.with_name(f"{dest.name}.own-bias.onnx")
    onnx.save(model, str(owned))
    return owned


class _Graphs:
    """The ONNX graph a QNN artifact is compiled from: the component's fp32 graph (fp16 artifacts) or
    that graph quantized to static QDQ, made once and kept for the next caller.

    One job needs it up to three times (the export compiles it, the scheme reference runs the QDQ
    graph, the `.dlc`'s stored-tensor check reads its weights), and a sweep's next job (the same
    component in another scheme) needs the same fp32 graph again. Profiled on the tiny 15-step
    predictor frame (fp16, 2 shared cores): its ONNX export took 166 s (torch.export's tracing and
    decompositions of the unrolled loop, then onnxscript's rewrites), the HTP compile 29 s, the
    `.dlc` 5 s, a simulated run 5 s: making that graph again was most of the job.

    The fp32 graph is kept by content (`_float_key`: edgex's source, the tool versions, the
    component's name, specs and every parameter and buffer byte), as ONNX export is deterministic
    (same bytes on a rebuild). QDQ graphs depend also on the calibration sets, which the recipe
    draws from its seeded eager pipeline, so they are kept for the same component object only;
    within one export the scheme reference is then the compiled graph by construction, and `edgex
    verify` (a new process) makes it again and checks its digest against the binary's record. One
    fp32 graph is kept at a time, in a private temporary folder.

    The folder is removed by `clear`, at exit in the process that made it (`atexit`), and with the
    job's temporary folder in a forked job (`edgex.isolation.run_forked`), whose `os._exit` runs
    no `atexit`. A forked child inherits this object: it may read the parent's graphs, but its
    `clear` only forgets a folder it did not make, which the parent still points to."""

    def __init__(self):
        self._key, self._folder, self._maker, self._owner, self._made = None, None, None, None, {}

    def get(self, component: Component, precision: str, calibration_size: int | None) -> tuple[Path, dict]:
        """(graph, quantization details; {} for fp16), read-only for callers."""
        if self._owner is None or self._owner() is not component:
            key = _float_key(component)
            if key != self._key:
                self.clear()
                self._key, self._folder, self._maker = key, Path(tempfile.mkdtemp(prefix="edgex-qnn-graphs-")), os.getpid()
            self._owner, self._made = weakref.ref(component), {k: v for k, v in self._made.items() if k == ("float", None)}
        key = (precision, calibration_size or component.calibration_size) if precision in _SCHEMES else ("float", None)
        if key not in self._made:
            try:
                graph = self._folder / f"{component.name}.onnx"
                if ("float", None) not in self._made:
                    OnnxExporter().graph(component, "fp32", graph)
                    self._made[("float", None)] = (graph, {})
                if key[1] is not None:
                    quantized = self._folder / f"{component.name}.{precision}.{key[1]}.qdq.onnx"
                    self._made[key] = (quantized, quantize_qdq(graph, quantized, component, precision, key[1]))
            except BaseException:  # nothing half-made is kept
                self.clear()
                raise
        return self._made[key]

    def clear(self) -> None:
        if self._folder is not None and self._maker == os.getpid():
            shutil.rmtree(self._folder, ignore_errors=True)
        self._key, self._folder, self._maker, self._owner, self._made = None, None, None, None, {}


def _float_key(component: Component) -> str:
    """sha256 of what a component's fp32 ONNX graph is a function of (see `_Graphs`): edgex's source,
    the tool versions, the component's specs, its modules' classes, every parameter and buffer."""
    import torch

    from ..artifacts.keys import edgex_source_sha256
    from ..toolchain import versions

    specs = [component.name, [s.to_json() for s in component.inputs], [s.to_json() for s in component.outputs]]
    # The graph is a function of its modules' code too: a module of a class defined outside edgex and
    # its pinned packages (a wrapper patched for a test) must not get another module's graph back.
    classes = [f"{name}:{type(m).__module__}.{type(m).__qualname__}" for name, m in component.module.named_modules()]
    digest = hashlib.sha256(json.dumps([edgex_source_sha256(), versions(), specs, classes], sort_keys=True, default=str).encode())
    for name, tensor in itertools.chain(component.module.named_parameters(), component.module.named_buffers()):
        digest.update(f"{name}\0{tuple(tensor.shape)}\0{tensor.dtype}\0".encode())
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


_GRAPHS = _Graphs()
atexit.register(_GRAPHS.clear)


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


def _metadata(model_path: Path) -> dict[str, str]:
    import onnx

    return {p.key: p.value for p in onnx.load(str(model_path), load_external_data=False).metadata_props}


def _record_digest(ctx: Path, qdq: Path) -> str:
    """Write the QDQ graph's digest into the EPContext model (hashed with it in the manifest)."""
    import onnx

    from .qdq_scheme import graph_digest

    digest = graph_digest(onnx.load(str(qdq)))
    model = onnx.load(str(ctx), load_external_data=False)
    onnx.helper.set_model_props(model, {**_metadata(ctx), QDQ_DIGEST: digest})
    onnx.save(model, str(ctx))
    return digest


def _fp16_on_htp(source: Path) -> list[str]:
    """Nodes left in float (fp16 on the HTP) whatever the scheme: the HTP's 16-bit quantized
    Sqrt -> Reciprocal of an RMSNorm is wrong for small variances (measured on a tiny LLM decode graph:
    the same QDQ graph scores 13-16 dB on ONNX Runtime CPU and 0-4 dB in the HTP simulator, 13-17 dB
    with these nodes in float)."""
    import onnx

    graph = onnx.load(str(source), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type in _FLOAT_OPS]


# Ops that only move or reshape a tensor: followed from a noise input to the Add that uses it.
_MOVES = ("Slice", "Gather", "Split", "Squeeze", "Unsqueeze", "Reshape", "Transpose", "Identity", "Cast")
_CHOICES = ("ArgMax", "TopK")


def sampling_nodes(source: Path, component: Component) -> list[str]:
    """The nodes of a sampling graph that take its noise input to the scores and the choice (the
    moves of the noise, the Add `logits + noise`, the ArgMax after it): left in float (fp16 on the
    HTP) whatever the scheme. A static range calibrated by min / max on a few noise draws clips a later draw's larger
    values, and Gumbel noise is unbounded: every score above the range saturates to the same value
    and the argmax among them is arbitrary (measured on an unrolled 15-step sampling graph at
    w8a16: one step's Add calibrated to 8.95, a held-out draw's best score there 14.07, a code
    flipped at margin 4.55 against a 0.65 tie margin; docs/targets-and-formats.md). In fp16 the
    scores are resolved to 2^-7 at 16."""
    import onnx

    noise = {s.sampled_from[1] for s in component.outputs if s.sampled_from and s.sampled_from[1]}
    if not noise:
        return []
    graph = onnx.load(str(source), load_external_data=False).graph
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found, frontier = [], [i.name for i in graph.input if i.name in noise]
    while frontier:
        for node in consumers.get(frontier.pop(), []):
            if node.name in found or node.op_type not in (*_MOVES, "Add"):
                continue
            found.append(node.name)
            if node.op_type in _MOVES:
                frontier += list(node.output)
            else:  # the choice read from the scores: a quantized input would be the same saturated range
                found += [c.name for out in node.output for c in consumers.get(out, []) if c.op_type in _CHOICES]
    return found


def _context_binary(ctx: Path) -> Path:
    """The `.bin` an EPContext model points at (its `ep_cache_context` attribute)."""
    import onnx

    model = onnx.load(str(ctx), load_external_data=False)
    names = {onnx.helper.get_attribute_value(a).decode() for n in model.graph.node if n.op_type == "EPContext"
             for a in n.attribute if a.name == "ep_cache_context"}
    if len(names) != 1:
        raise RuntimeError(f"expected one QNN context binary, the EPContext model names {len(names)}: whole graph not on the HTP?")
    return ctx.parent / names.pop()


def _dequantize(q, *, scale, zero, axis: int):
    """ONNX DequantizeLinear: (q - zero) * scale, per tensor or along `axis`."""
    import numpy as np

    if np.ndim(scale) == 1 and np.size(scale) > 1:
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), np.reshape(zero, shape) if np.size(zero) > 1 else zero
    return ((q.astype(np.float32) - zero) * scale).astype(np.float32)


def _gathered_then_scaled(model, inits: dict) -> list[tuple[str, float]]:
    """(table, factor) for each float table a Gather reads whose rows are then multiplied by a
    scalar constant (a token embedding times sqrt(hidden)): the HTP's fp16 graph stores that table
    already multiplied (measured: two VLAs' prefix graphs, `embed_tokens` x 8 on the tiny
    preset, rows contiguous in fp16), so it is looked for that way too."""
    import numpy as np
    from onnx import numpy_helper

    scalars = {n: float(a.reshape(-1)[0]) for n, a in inits.items() if a.size == 1 and a.dtype.kind == "f"}
    scalars |= {n.output[0]: float(numpy_helper.to_array(n.attribute[0].t).reshape(-1)[0]) for n in model.graph.node
                if n.op_type == "Constant" and n.attribute[0].name == "value" and np.prod(n.attribute[0].t.dims) == 1
                and n.attribute[0].t.data_type in (1, 10)}
    gathered = {n.output[0]: n.input[0] for n in model.graph.node
                if n.op_type == "Gather" and n.input[0] in inits and inits[n.input[0]].dtype.kind == "f"}
    found = []
    for node in model.graph.node:
        if node.op_type == "Mul" and len(node.input) == 2:
            for table, factor in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
                if table in gathered and factor in scalars and scalars[factor] not in (0.0, 1.0):
                    found.append((gathered[table], scalars[factor]))
    return found


def _located(data: bytes, raw) -> "np.ndarray | None":
    """The 2-D `raw` as `data` stores it, rows contiguous, whole or split into column blocks: each
    block of `_column_blocks` is located on its own (`_located_block`) and the table read back
    from where its blocks are. The HTP splits some tables so (measured: a tiny LLM decode graph's
    w8a16 embedding, uint16 [131072, 64], stored as two [131072, 32] blocks of 8 MiB, row i of
    each at its block's start + i * 64 bytes, 512 bytes between the blocks). None where some block
    is not found (e.g. tiled)."""
    import numpy as np

    for blocks in _column_blocks(raw.shape[1]):
        width = raw.shape[1] // blocks
        parts = []
        for b in range(blocks):
            part = _located_block(data, np.ascontiguousarray(raw[:, b * width:(b + 1) * width]))
            if part is None:
                break
            parts.append(part)
        else:
            return np.concatenate(parts, axis=1) if blocks > 1 else parts[0]
    return None


def _column_blocks(width: int, least: int = 16) -> list[int]:
    """How many equal column blocks a table of `width` columns is looked for in: 1, then 2, 4, ...
    while a block keeps at least `least` values (16 bytes of 8-bit codes: a shorter probe matches
    by chance)."""
    counts, n = [], 1
    while width % n == 0 and width // n >= least:
        counts.append(n)
        n *= 2
    return counts or [1]


def _located_block(data: bytes, raw) -> "np.ndarray | None":
    """The 2-D `raw` as `data` stores it, rows contiguous: the rows' bytes are searched at up to 64
    places, and the start most found rows agree on (row i at start + i * row bytes) is read back.
    None where 8 probes spread over the rows find none (not stored so, e.g. tiled)."""
    import numpy as np
    from collections import Counter

    rows, row_bytes = raw.shape[0], raw[0].nbytes
    starts: Counter = Counter()
    for n, i in enumerate(np.unique(np.linspace(0, rows - 1, 64).astype(int))):
        at = data.find(np.ascontiguousarray(raw[i]).tobytes())
        if at >= 0:
            starts[at - i * row_bytes] += 1
        elif n >= 8 and not starts:
            return None
    if not starts:
        return None
    start = starts.most_common(1)[0][0]
    if start < 0 or start + raw.nbytes > len(data):
        return None
    return np.frombuffer(data, raw.dtype, raw.size, start).reshape(raw.shape)


@EXPORTERS.register("qnn")
class QnnExporter(Exporter):
    name = "qnn"
    format = "qnn-context"
    sidecar_formats = ("qnn-dlc",)
    backend = "qnn-htp"
    extension = ".qnn.onnx"
    runtime = "qnn-htp"
    precisions = ("fp16", *_SCHEMES)
    schemes = {  # what each precision means in this format, one line each (edgex list)
        "fp16": "the float graph computed in fp16 on the HTP",
        "w8a16": "static QDQ: uint8 weights (per tensor in MatMul, per channel in Conv), uint16 activations calibrated on eager activations",
        "w4a16": "static QDQ: int4 symmetric weights (per tensor in MatMul, per channel in Conv), uint16 activations calibrated on eager activations",
        "w8a8": "static QDQ: uint8 weights (per tensor in MatMul, per channel in Conv), uint8 activations calibrated on eager activations",
    }
    requires = ("onnx", "onnxscript", "onnxruntime_qnn")

    def scheme_reference(self, component: Component, precision: str, files: list[Path], *,
                         calibration_size: int | None = None, **_target):
        """QDQ schemes: the eager model with the integers, scales and zero points of the QDQ graph the
        context binary was compiled from, dequantized and swapped in, and each linear layer's input
        fake-quantized at the scale that graph records (`qdq_scheme`): the graph's
        numbers, applied by eager PyTorch, never its operators. The graph is made again with the
        same quantizer config and calibration sets (deterministic) and must have the digest the
        export recorded in the EPContext model (`QDQ_DIGEST`), so they are the numbers that were
        compiled; `stored_quantized` checks each against the independent quantizer. The fp32 graph
        the QDQ graph was made from is scored against eager at the fp32 gate too: a bug in the
        wrapper or the ONNX export would otherwise be in the QDQ graph's weights and scales alike."""
        import onnx

        from .qdq_scheme import graph_digest
        from ..parity.scheme import build, called_modules
        from .qdq_scheme import qdq_stored_scheme

        if precision not in _SCHEMES:
            return super().scheme_reference(component, precision, files)
        graph, details = _GRAPHS.get(component, precision, calibration_size)
        model = onnx.load(str(graph))
        recorded = _metadata(files[0]).get(QDQ_DIGEST)
        digest = graph_digest(model)
        if recorded != digest:
            raise RuntimeError(f"the QDQ graph made again (sha256 {digest[:12]}) is not the one the context binary was compiled "
                               f"from ({QDQ_DIGEST} {str(recorded)[:12]})")
        float_graph, _ = _GRAPHS.get(component, "fp16", None)
        scheme = qdq_stored_scheme(component, model, onnx.load(str(float_graph)), called_modules(component))
        float_report = _float_graph_parity(component, float_graph)
        scheme.details = {"graph_sha256": digest, "quantization": details,
                          "float_graph": {k: float_report[k] for k in ("min_snr_db", "threshold_db", "verdict")}}
        scheme.failures = [f"the fp32 graph the QDQ graph was made from: {f}" for f in float_report["failures"]]
        return build(component, scheme)

    def stored_quantized(self, component: Component, files: list[Path], precision: str, *, calibration_size: int | None = None,
                         **_target):
        """QDQ schemes. The context binary tiles its weights in the HTP's own layout, so its
        quantized constants are those of the QDQ graph it was compiled from (made again, its digest
        checked against the one recorded in the EPContext model, as for the scheme reference),
        each against the independent quantizer. The `.dlc`: the same constants, each read from the
        `.dlc` itself where its integers are found byte for byte in `model.params.bin` and its
        scales (float32) in `model`; a constant not found there fails."""
        import onnx

        from .qdq_scheme import qdq_tensors

        if precision not in _SCHEMES:
            return None
        graph, _ = _GRAPHS.get(component, precision, calibration_size)
        model = onnx.load(str(graph))
        if files[0].suffix != ".dlc":
            from .qdq_scheme import graph_digest

            if _metadata(files[0]).get(QDQ_DIGEST) != graph_digest(model):
                return {"QDQ graph": _mismatch("the QDQ graph made again is not the one the context binary records")}
        float_graph, _ = _GRAPHS.get(component, "fp16", None)
        found = qdq_tensors(model, onnx.load(str(float_graph)))
        if files[0].suffix == ".dlc":
            found = _in_dlc(files[0], model, found)
        return found

    def stored_constants(self, component: Component, files: list[Path], precision: str, *, calibration_size: int | None = None,
                         **_target):
        """The context binary is the HTP's own format, but it keeps a gather's table as it is given,
        rows contiguous, whole or in column blocks (`_located`; measured: the predictor step's stacked
        table in fp16, row i at a fixed base + i * 128 bytes; an LLM decode graph's w8a16 table in
        uint16 codes, two blocks of 32 columns), while it tiles matmul weights. So each 2-D constant of the graph the binary
        was compiled from (`_GRAPHS`, as for the scheme reference), encoded the way the HTP stores
        it (fp16 for float constants, the QDQ graph's integers for quantized ones), is located in the
        binary by its rows' bytes and read from there, decoded (a 3-D constant, a stack of tables,
        by the rows of all of them). Only constants that may hold one of the component's tables are
        looked for (`may_hold_table`); those not stored so (tiled weights) are not listed."""
        import numpy as np
        import onnx
        from onnx import numpy_helper

        from ..parity.tensors import may_hold_table

        graph, _ = _GRAPHS.get(component, precision, calibration_size)
        model = onnx.load(str(graph))
        inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        encoded = {}  # constant name -> (array as the HTP stores it, decode to float32)
        for node in model.graph.node:
            if node.op_type == "DequantizeLinear" and node.input[0] in inits:
                scale = inits[node.input[1]].astype(np.float32)
                zero = inits[node.input[2]].astype(np.float32) if len(node.input) > 2 and node.input[2] else np.float32(0)
                axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
                encoded[node.input[0]] = (inits[node.input[0]], partial(_dequantize, scale=scale, zero=zero, axis=axis))
        for name, array in inits.items():
            if name not in encoded and array.dtype.kind == "f":
                encoded[name] = (array.astype(np.float16), lambda a: a.astype(np.float32))
        for name, factor in _gathered_then_scaled(model, inits):  # the HTP folds the scale into the table
            encoded[f"{name} x {factor:g}"] = ((inits[name].astype(np.float32) * factor).astype(np.float16),
                                              lambda a, factor=factor: a.astype(np.float32) / factor)
        data = _context_binary(files[0]).read_bytes()
        found = {}
        for name, (raw, decode) in encoded.items():
            if not may_hold_table(raw.shape, component.tables):
                continue
            rows = raw.reshape(-1, raw.shape[-1]) if raw.ndim >= 2 else raw  # a stack of tables as its rows
            stored = _located(data, rows) if rows.ndim == 2 and rows.shape[0] >= 16 and raw.dtype.itemsize <= 2 else None
            if stored is not None:
                found[name] = decode(stored.reshape(raw.shape))
        return found

    def _binary_tables(self, component: Component, files: list[Path], precision: str, calibration_size: int | None):
        """The context binary's gather tables (`stored_constants`). A table not found row-contiguous
        (whole or in column blocks) is unverified, not missing: the HTP may keep some table another
        way, and its layout is not documented."""
        tables = super().stored_tensors(component, files, precision, calibration_size=calibration_size)
        for name, t in (tables or {}).items():
            if t.stored is None:
                tables[name] = StoredTensor("unverified: not found stored row-contiguous in the HTP context binary, whose "
                                            "layout for it is unknown", None, t.original, rows=True, readable=False)
        return tables

    def stored_tensors(self, component: Component, files: list[Path], precision: str, *, calibration_size: int | None = None,
                       **_target) -> dict[str, StoredTensor] | None:
        """The `.dlc` sidecar, which nothing here runs: every weight of the graph it was written from
        (the fp32 graph for fp16, made again; the QDQ graph for the quantized schemes, made again as
        for the scheme reference) must be in the .dlc's tensor data byte for byte, as stored or
        in QAIRT's layout (`_QAIRT_LAYOUTS`). A changed byte in a weight makes that
        weight missing: its figure is -inf dB and the entry fails. The context binary's weights are
        covered by its parity run instead (None)."""
        import numpy as np
        import onnx
        from onnx import numpy_helper

        if files[0].suffix != ".dlc":
            return self._binary_tables(component, files, precision, calibration_size)
        graph, _ = _GRAPHS.get(component, precision, calibration_size)
        model = onnx.load(str(graph))
        data = dlc_members(files[0])["model.params.bin"]
        quantized = {n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
        scales = {i for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear") for i in n.input[1:]}
        folded = _folded_constants(model.graph)
        found = {}
        for init in model.graph.initializer:
            array = numpy_helper.to_array(init)
            weight = init.name in quantized or (array.dtype.kind == "f" and init.name not in scales)
            if not weight or array.size < 2:
                continue
            layouts = [array, *(array.transpose(p) for p in _QAIRT_LAYOUTS.get(array.ndim, ()))]
            stored = any(data.find(np.ascontiguousarray(a).tobytes()) >= 0 for a in layouts)
            values = array.astype(np.float32)
            if not stored and init.name in folded:
                found[init.name] = StoredTensor(_FOLDED, None, values, readable=False)
                continue
            found[init.name] = StoredTensor(f"{array.dtype} in model.params.bin", values if stored else None, values)
        return found

    def before_lowering(self, component: Component, precision: str, *, calibration_size: int | None = None, **_target) -> None:
        """The graph to compile (`_GRAPHS`), made in the job's process: the lowering's process reads
        it from there, and so do the scheme reference and the stored-tensor checks after it, which
        made it a second time when only the lowering's process had (the tiny predictor frame's fp32
        ONNX export is minutes)."""
        _GRAPHS.get(component, precision, calibration_size)

    def export(self, component: Component, precision: str, dest: Path, *, soc_model: int, htp_arch: int,
               calibration_size: int | None = None) -> ExportResult:
        details = {"qairt": qairt_version(), "onnxruntime_qnn": plugin_version(), "soc_model": soc_model,
                   "htp_arch": f"v{htp_arch}"}
        stem = dest.name.removesuffix(self.extension)
        dlc = dest.with_name(f"{stem}.dlc")
        graph, quantization = _GRAPHS.get(component, precision, calibration_size)
        details.update(quantization)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            htp_session(graph, soc_model=soc_model, htp_arch=htp_arch, fp16=True, context_out=dest)
            if precision in _SCHEMES:
                details["qdq_graph_sha256"] = _record_digest(dest, graph)
            dumps = Path(tmp) / "dlc"
            dumps.mkdir()
            htp_session(graph, soc_model=soc_model, htp_arch=htp_arch, fp16=True, dlc_dir=dumps)
            written = sorted(dumps.glob("*.dlc"))
            if len(written) != 1:
                raise RuntimeError(f"QNN IR backend wrote {len(written)} .dlc files, expected one graph")
            shutil.move(written[0], dlc)
        dlc_entry = Sidecar([dlc], "qnn-dlc", self.backend, reason=DLC_UNRUN)
        return ExportResult([dest, _context_binary(dest)], "float32", details, sidecars=[dlc_entry])


def _float_graph_parity(component: Component, graph: Path) -> dict:
    """The fp32 ONNX graph run on ONNX Runtime CPU against eager, gated at the fp32 gate."""
    from ..parity.check import measure
    from ..parity.gates import DEFAULT_DB
    from ..parity.runtimes import RUNTIMES

    runtime = RUNTIMES.get("onnxruntime")
    report = measure(component, runtime.load([graph]), runtime.name, "float32", DEFAULT_DB["fp32"])
    return {"min_snr_db": report.min_snr_db, "threshold_db": report.threshold_db, "verdict": report.verdict,
            "failures": report.failures}


def _mismatch(why: str):
    import numpy as np

    from ..parity.quantized import QuantizedTensor

    return QuantizedTensor(np.zeros((1,), np.float32), np.zeros((0,), np.float32), None, source=why)


def _in_dlc(path: Path, model, tensors: dict) -> dict:
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
    data, graph = members["model.params.bin"], members["model"]
    qdq = dequantized_constants(model)
    for name, tensor in tensors.items():
        _, q, scale, zero, _axis = qdq[name]
        layouts = [q, *(q.transpose(p) for p in _QAIRT_LAYOUTS.get(q.ndim, ()))]
        codes = q.size < 2 or any(data.find(np.ascontiguousarray(a).tobytes()) >= 0 for a in layouts)
        scales = all(graph.find(pair) >= 0 for pair in _scale_offset_pairs(scale, zero))
        if not (codes and scales):
            what = " and ".join(w for w, ok in (("integers", codes), ("scales / zero points", scales)) if not ok)
            tensors[name] = _mismatch(f"{what} not found in the .dlc")
    return tensors


def _scale_offset_pairs(scale, zero) -> list[bytes]:
    """QNN's scale-offset pair of each channel (one for a per-tensor constant) as the `.dlc`'s graph
    member stores it: float32 scale, then int32 offset = -zero point, the offset left out where it
    is 0 (the field's default)."""
    import numpy as np

    scales = np.asarray(scale, np.float32).reshape(-1)
    zeros = np.broadcast_to(np.asarray(zero).reshape(-1).astype(np.int64), scales.shape)
    return [s.tobytes() + (np.int32(-z).tobytes() if z else b"") for s, z in zip(scales, zeros)]


_FOLDED = ("unverified: read only by nodes whose inputs are all constants, which QAIRT folds into new constants when "
           "it writes the .dlc (so the tensor is not stored as given); the context binary's parity run covers them")


def _folded_constants(graph) -> set[str]:
    """Initializers every reader of which computes from constants only (looking through
    DequantizeLinear): QAIRT evaluates such nodes when it writes the .dlc and stores their results,
    not these inputs. Measured on a one-pass action policy whose first decoder layer starts from a constant zero query:
    its self-attention and norm1 are input-independent, and the .dlc held neither norm1's weight
    nor the constants around it."""
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
