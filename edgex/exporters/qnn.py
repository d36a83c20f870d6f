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

import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EdgexError
from ..qnn import htp_session, plugin_version, qairt_version
from . import EXPORTERS
from .base import ExportResult, Exporter, Sidecar, StoredTensor
from .onnx import OnnxExporter, nodes_from_modules

if TYPE_CHECKING:
    from ..component import Component

# scheme -> (weight type, activation type) as onnxruntime.quantization.QuantType names
_FLOAT_OPS = ("Sqrt", "Reciprocal")
_SCHEMES = {"w8a16": ("QUInt8", "QUInt16"), "w4a16": ("QInt4", "QUInt16"), "w8a8": ("QUInt8", "QUInt8")}
# The .dlc is written by its own backend session (QAIRT's IR backend), holds its own copy of the
# weights and runs only in QAIRT's tools, so the context binary's parity does not speak for it.
DLC_UNRUN = ("the .dlc is a separate QAIRT IR build with its own weights; QAIRT's runners (qnn-net-run, SNPE) "
             "are not installable here, so nothing on this machine runs it (--hub runs it on a device)")

# Weight layouts QAIRT stores besides ONNX's own (axis orders of the ONNX initializer): MatMul
# weights [out, in]; Conv / ConvTranspose kernels channels-last, [kh, kw, in, out] (2-D) and
# [k, in, out] (1-D, which QNN runs as 2-D) or with in / out swapped for transposed convolutions.
_QAIRT_LAYOUTS = {2: ((1, 0),), 3: ((2, 1, 0), (2, 0, 1)), 4: ((2, 3, 1, 0), (2, 3, 0, 1))}

QDQ_DIGEST = "edgex.qdq_graph_sha256"  # EPContext metadata: the QDQ graph the context binary was compiled from


def quantize_qdq(source: Path, dest: Path, component: Component, precision: str, size: int) -> dict:
    """Static QDQ quantization for the HTP, calibrated on `size` input sets from the eager pipeline."""
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
    float_only = nodes_from_modules(source, component.float_only)
    htp_fp16 = _fp16_on_htp(source)
    config = get_qnn_qdq_config(str(source), Reader(), activation_type=getattr(QuantType, activations),
                                weight_type=getattr(QuantType, weights), per_channel=True,
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


def _qdq_graph(component: Component, precision: str, tmp: Path, calibration_size: int | None) -> tuple[Path, dict]:
    """The component's fp32 ONNX graph quantized to static QDQ in `tmp`: what export compiles and
    the scheme reference runs."""
    graph = tmp / f"{component.name}.onnx"
    OnnxExporter().export(component, "fp32", graph)
    quantized = tmp / f"{component.name}.qdq.onnx"
    details = quantize_qdq(graph, quantized, component, precision, calibration_size or component.calibration_size)
    return quantized, details


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

    from ..parity.graph_reference import graph_digest

    digest = graph_digest(onnx.load(str(qdq)))
    model = onnx.load(str(ctx), load_external_data=False)
    onnx.helper.set_model_props(model, {**_metadata(ctx), QDQ_DIGEST: digest})
    onnx.save(model, str(ctx))
    return digest


def _fp16_on_htp(source: Path) -> list[str]:
    """Nodes left in float (fp16 on the HTP) whatever the scheme: the HTP's 16-bit quantized
    Sqrt -> Reciprocal of an RMSNorm is wrong for small variances (measured on Spark-X2.5 tiny decode:
    the same QDQ graph scores 13-16 dB on ONNX Runtime CPU and 0-4 dB in the HTP simulator, 13-17 dB
    with these nodes in float)."""
    import onnx

    graph = onnx.load(str(source), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type in _FLOAT_OPS]


def _context_binary(ctx: Path) -> Path:
    """The `.bin` an EPContext model points at (its `ep_cache_context` attribute)."""
    import onnx

    model = onnx.load(str(ctx), load_external_data=False)
    names = {onnx.helper.get_attribute_value(a).decode() for n in model.graph.node if n.op_type == "EPContext"
             for a in n.attribute if a.name == "ep_cache_context"}
    if len(names) != 1:
        raise RuntimeError(f"expected one QNN context binary, the EPContext model names {len(names)}: whole graph not on the HTP?")
    return ctx.parent / names.pop()


@EXPORTERS.register("qnn")
class QnnExporter(Exporter):
    name = "qnn"
    format = "qnn-context"
    backend = "qnn-htp"
    extension = ".qnn.onnx"
    runtime = "qnn-htp"
    precisions = ("fp16", *_SCHEMES)
    schemes = {  # what each precision means in this format, one line each (edgex list)
        "fp16": "the float graph computed in fp16 on the HTP",
        "w8a16": "static QDQ: uint8 per-channel weights, uint16 activations calibrated on eager activations",
        "w4a16": "static QDQ: int4 per-channel weights, uint16 activations calibrated on eager activations",
        "w8a8": "static QDQ: uint8 per-channel weights, uint8 activations calibrated on eager activations",
    }
    requires = ("onnx", "onnxscript", "onnxruntime_qnn")

    def scheme_reference(self, component: Component, precision: str, files: list[Path], *,
                         calibration_size: int | None = None, **_target):
        """QDQ schemes: the QDQ ONNX graph the context binary was compiled from, run on ONNX Runtime
        CPU, which executes every QuantizeLinear / DequantizeLinear exactly: the HTP's lowering is
        then all that separates the artifact from it. The graph is made again with the same
        quantizer config and calibration sets (deterministic) and must have the digest the export
        recorded in the EPContext model (`QDQ_DIGEST`), so it is the graph that was compiled."""
        import onnx

        from ..parity.graph_reference import GraphReference, graph_digest

        if precision not in _SCHEMES:
            return super().scheme_reference(component, precision, files)
        with tempfile.TemporaryDirectory() as tmp:
            graph, details = _qdq_graph(component, precision, Path(tmp), calibration_size)
            model = onnx.load(str(graph))
        recorded = _metadata(files[0]).get(QDQ_DIGEST)
        digest = graph_digest(model)
        if recorded != digest:
            raise RuntimeError(f"the QDQ graph made again (sha256 {digest[:12]}) is not the one the context binary was compiled "
                               f"from ({QDQ_DIGEST} {str(recorded)[:12]})")
        return GraphReference(component, model, "QDQ ONNX on ONNX Runtime CPU (the graph the context binary was compiled from)",
                              {"quantization": details})

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
            return None
        with tempfile.TemporaryDirectory() as tmp:
            if precision in _SCHEMES:
                graph, _ = _qdq_graph(component, precision, Path(tmp), calibration_size)
            else:
                graph = Path(tmp) / f"{component.name}.onnx"
                OnnxExporter().export(component, "fp32", graph)
            model = onnx.load(str(graph))
        data = dlc_members(files[0])["model.params.bin"]
        quantized = {n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
        scales = {i for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear") for i in n.input[1:]}
        found = {}
        for init in model.graph.initializer:
            array = numpy_helper.to_array(init)
            weight = init.name in quantized or (array.dtype.kind == "f" and init.name not in scales)
            if not weight or array.size < 2:
                continue
            layouts = [array, *(array.transpose(p) for p in _QAIRT_LAYOUTS.get(array.ndim, ()))]
            stored = any(data.find(np.ascontiguousarray(a).tobytes()) >= 0 for a in layouts)
            values = array.astype(np.float32)
            found[init.name] = StoredTensor(f"{array.dtype} in model.params.bin", values if stored else None, values)
        return found

    def export(self, component: Component, precision: str, dest: Path, *, soc_model: int, htp_arch: int,
               calibration_size: int | None = None) -> ExportResult:
        details = {"qairt": qairt_version(), "onnxruntime_qnn": plugin_version(), "soc_model": soc_model,
                   "htp_arch": f"v{htp_arch}"}
        stem = dest.name.removesuffix(self.extension)
        dlc = dest.with_name(f"{stem}.dlc")
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            if precision in _SCHEMES:
                graph, quantization = _qdq_graph(component, precision, Path(tmp), calibration_size)
                details.update(quantization)
            else:
                graph = Path(tmp) / f"{component.name}.onnx"
                OnnxExporter().export(component, "fp32", graph)
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
