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
from .base import ExportResult, Exporter, Sidecar
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


def read_qdq(fp32: Path, qdq: Path, signed_activations: bool = False):
    """The weights a QDQ graph stores (each DequantizeLinear of an initializer, dequantized, paired
    with the fp32 graph's initializer it replaced) and the static quantization of each MatMul /
    Gemm's activation input, keyed by the module the node came from (torch.onnx's name scopes in
    the fp32 graph)."""
    import ast

    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper

    from ..parity.scheme import STATIC, ActivationQuant, StoredWeight

    source = onnx.load(str(fp32)).graph
    originals = {t.name: t for t in source.initializer}
    scopes_of = {n.name: next((ast.literal_eval(p.value) for p in n.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), [])
                 for n in source.node}  # the quantizer keeps node names but drops their metadata
    graph = onnx.load(str(qdq)).graph
    inits = {t.name: t for t in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}

    def dequantize(node) -> np.ndarray:
        x = numpy_helper.to_array(inits[node.input[0]]).astype(np.float64)
        scale = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
        zero = numpy_helper.to_array(inits[node.input[2]]).astype(np.float64) if len(node.input) > 2 and node.input[2] else 0.0
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if np.ndim(scale) == 1 and x.ndim > 1:
            shape = [1] * x.ndim
            shape[axis] = -1
            scale, zero = scale.reshape(shape), np.reshape(zero, shape) if np.ndim(zero) else zero
        return np.asarray((x - zero) * scale)

    weights, activations = {}, {}
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            name = node.input[0].removesuffix("_quantized")
            if name in originals:
                original = numpy_helper.to_array(originals[name]).astype(np.float32)
                weights[name] = StoredWeight(torch.from_numpy(original.copy()),
                                             torch.from_numpy(dequantize(node).astype(np.float32)))
        elif node.op_type in ("MatMul", "Gemm"):
            source = producer.get(node.input[0])
            quant = producer.get(source.input[0]) if source is not None and source.op_type == "DequantizeLinear" else None
            scopes = scopes_of.get(node.name, [])
            if quant is None or quant.op_type != "QuantizeLinear" or len(scopes) < 3:
                continue  # scopes: root, module path(s), op; a bare op is no module's
            zero = inits[quant.input[2]]
            bits = 16 if zero.data_type in (onnx.TensorProto.UINT16, onnx.TensorProto.INT16) else 8
            signed = zero.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.INT16)
            activations[scopes[-2]] = ActivationQuant(STATIC, bits, signed, float(numpy_helper.to_array(inits[quant.input[1]])),
                                                      int(numpy_helper.to_array(zero)))
    return weights, activations


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

    def stored_scheme(self, component: Component, precision: str, files: list[Path], *, calibration_size: int | None = None,
                      **_target):
        """QDQ ONNX, quantized again with the same config: the context binary holds the weights in
        QNN's own format, but it is compiled from the QDQ graph `quantize_qdq` writes, which is
        deterministic (same graph, same calibration sets). Its DequantizeLinear weights are read
        back, and each MatMul's activation quantizer (static, calibrated) is applied on the input
        of the module the MatMul came from. Activation quantizers elsewhere (every other tensor
        of a QDQ graph) are not modelled: their error counts as lowering."""
        from ..parity.scheme import StoredScheme

        if precision not in _SCHEMES:
            return super().stored_scheme(component, precision, files)
        with tempfile.TemporaryDirectory() as tmp:
            graph = Path(tmp) / f"{component.name}.onnx"
            OnnxExporter().export(component, "fp32", graph)
            quantized = Path(tmp) / f"{component.name}.qdq.onnx"
            quantize_qdq(graph, quantized, component, precision, calibration_size or component.calibration_size)
            weights, activations = read_qdq(graph, quantized)
        modules = dict(component.module.named_modules())
        skipped = sorted(n for n in activations if n not in modules)
        notes = ["static activation quantization modelled on MatMul/Gemm inputs only"]
        if skipped:
            notes.append(f"activation quantizers of unknown modules not applied: {', '.join(skipped)}")
        return StoredScheme("QDQ ONNX (same quantizer config, re-run)", weights,
                            {n: q for n, q in activations.items() if n in modules}, notes)

    def export(self, component: Component, precision: str, dest: Path, *, soc_model: int, htp_arch: int,
               calibration_size: int | None = None) -> ExportResult:
        details = {"qairt": qairt_version(), "onnxruntime_qnn": plugin_version(), "soc_model": soc_model,
                   "htp_arch": f"v{htp_arch}"}
        stem = dest.name.removesuffix(self.extension)
        dlc = dest.with_name(f"{stem}.dlc")
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            graph = Path(tmp) / f"{component.name}.onnx"
            OnnxExporter().export(component, "fp32", graph)
            if precision in _SCHEMES:
                quantized = Path(tmp) / f"{component.name}.qdq.onnx"
                details.update(quantize_qdq(graph, quantized, component, precision,
                                            calibration_size or component.calibration_size))
                graph = quantized
            htp_session(graph, soc_model=soc_model, htp_arch=htp_arch, fp16=True, context_out=dest)
            dumps = Path(tmp) / "dlc"
            dumps.mkdir()
            htp_session(graph, soc_model=soc_model, htp_arch=htp_arch, fp16=True, dlc_dir=dumps)
            written = sorted(dumps.glob("*.dlc"))
            if len(written) != 1:
                raise RuntimeError(f"QNN IR backend wrote {len(written)} .dlc files, expected one graph")
            shutil.move(written[0], dlc)
        dlc_entry = Sidecar([dlc], "qnn-dlc", self.backend, reason=DLC_UNRUN)
        return ExportResult([dest, _context_binary(dest)], "float32", details, sidecars=[dlc_entry])
