"""Qualcomm HTP context binaries (+ QNN IR `.dlc`) from the component's ONNX graph.

The shape AI Hub calls "precompiled_qnn_onnx": an EPContext `.onnx` that points at a QNN context
binary `.bin` compiled offline for one SoC / HTP architecture, which ONNX Runtime's QNN execution
provider loads on the phone without recompiling. Beside it, the same graph through QAIRT's IR backend
as a `.dlc` for QAIRT's own tools: a sidecar with its own manifest entry, as nothing here runs it.

Precisions: `fp16` runs the float graph in half precision on the HTP. The quantized schemes are
static QDQ graphs made by ONNX Runtime's QNN quantizer, calibrated on activations the recipe draws
from the eager pipeline (`Component.calibration`), never on the parity samples.

What it draws on, by concern: `qnn_graphs` (the graphs compiled, made once and kept),
`qnn_quantize` (static QDQ), `qnn_bias` (bias surgery before it), `qnn_htp` (the nodes the HTP
keeps in float), `qnn_dlc` (what the `.dlc` stores) and `qnn_tables` (gather tables read back from
the context binary).
"""

from __future__ import annotations

import math
import shutil
import tempfile
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ..parity.stored import ReadOnDemand
from ..qnn import htp_session, plugin_version, qairt_version
from . import EXPORTERS
from .base import ExportResult, Exporter, Sidecar, StoredTensor
from .qnn_dlc import (DLC_UNRUN, FOLDED, QAIRT_LAYOUTS, dlc_members, folded_constants, half_weight_names, half_weights, in_dlc,
                      mismatch, oversized)
from .qnn_graphs import GRAPHS
from .qnn_quantize import SCHEMES
from .qnn_tables import context_binary, dequantize, gathered_then_scaled, located_all

if TYPE_CHECKING:
    from ..component import Component

QDQ_DIGEST = "edgex.qdq_graph_sha256"  # EPContext metadata: the QDQ graph the context binary was compiled from


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


@EXPORTERS.register("qnn")
class QnnExporter(Exporter):
    name = "qnn"
    format = "qnn-context"
    sidecar_formats = ("qnn-dlc",)
    backend = "qnn-htp"
    extension = ".qnn.onnx"
    runtime = "qnn-htp"
    precisions = ("fp16", *SCHEMES)
    schemes = {  # what each precision means in this format, one line each (edgex list)
        "fp16": "the float graph computed in fp16 on the HTP",
        "w8a16": "static QDQ: uint8 weights (per tensor in MatMul, per channel in Conv), uint16 activations calibrated on eager activations",
        "w4a16": "static QDQ: int4 symmetric weights (per tensor in MatMul, per channel in Conv), uint16 activations calibrated on eager activations",
        "w8a8": "static QDQ: uint8 weights (per tensor in MatMul, per channel in Conv), uint8 activations calibrated on eager activations",
    }
    requires = ("onnx", "onnxscript", "onnxruntime_qnn")
    # the HTP context build holds 5-6 GB for a 0.6b talker or unrolled predictor: one at a time
    lowering_alone = True
    # two compiles (the context binary, the .dlc) and a parity run on the HTP simulator: measured on a
    # 0.6b LLM prefill graph at fp16, 216 s here against 72 s as MNN
    cost_weight = 3.0
    # Peaks recorded here (2-core Xeon, 23 GiB) over the model's fp32 weights: 1.40 for a 1.01B-parameter
    # speech model's talker prefill at fp16 alone (5.66 GB), 1.48 for its predictor's context-binary
    # build (6.0 GB), 2.72 for a 0.45B vision-language-action model's language graph at fp16 alone
    # (4.9 GB; docs/troubleshooting.md names them). Below the smallest.
    memory_factor = 1.2

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

        if precision not in SCHEMES:
            return super().scheme_reference(component, precision, files)
        graph, details = GRAPHS.get(component, precision, calibration_size)
        model = onnx.load(str(graph))
        recorded = _metadata(files[0]).get(QDQ_DIGEST)
        digest = graph_digest(model)
        if recorded != digest:
            raise RuntimeError(f"the QDQ graph made again (sha256 {digest[:12]}) is not the one the context binary was compiled "
                               f"from ({QDQ_DIGEST} {str(recorded)[:12]})")
        float_graph, _ = GRAPHS.get(component, "fp16", None)
        scheme = qdq_stored_scheme(component, model, onnx.load(str(float_graph)), called_modules(component))
        float_report = _float_graph_parity(component, float_graph)
        scheme.details = {"graph_sha256": digest, "quantization": details,
                          "float_graph": {k: float_report[k] for k in ("min_snr_db", "threshold_db", "verdict", "gate")}}
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

        if precision not in SCHEMES:
            return None
        graph, _ = GRAPHS.get(component, precision, calibration_size)
        model = onnx.load(str(graph))
        if files[0].suffix != ".dlc":
            from .qdq_scheme import graph_digest

            if _metadata(files[0]).get(QDQ_DIGEST) != graph_digest(model):
                return {"QDQ graph": mismatch("the QDQ graph made again is not the one the context binary records")}
        float_graph, _ = GRAPHS.get(component, "fp16", None)
        found = qdq_tensors(model, onnx.load(str(float_graph)))
        if files[0].suffix == ".dlc":
            found = in_dlc(files[0], model, found)
        return found

    def stored_constants(self, component: Component, files: list[Path], precision: str, *, calibration_size: int | None = None,
                         **_target):
        """The context binary is the HTP's own format, but it keeps a gather's table as it is given,
        rows contiguous, whole or in column blocks (`located`; measured: the predictor step's stacked
        table in fp16, row i at a fixed base + i * 128 bytes; an LLM decode graph's w8a16 table in
        uint16 codes, two blocks of 32 columns), while it tiles matmul weights. So each 2-D constant of the graph the binary
        was compiled from (`GRAPHS`, as for the scheme reference), encoded the way the HTP stores
        it (fp16 for float constants, the QDQ graph's integers for quantized ones), is located in the
        binary by its rows' bytes and read from there, decoded (a 3-D constant, a stack of tables,
        by the rows of all of them). Only constants that may hold one of the component's tables are
        looked for (`may_hold_table`); those not stored so (tiled weights) are not listed."""
        import numpy as np
        import onnx
        from onnx import numpy_helper

        from ..parity.tensors import may_hold_table

        graph, _ = GRAPHS.get(component, precision, calibration_size)
        model = onnx.load(str(graph), load_external_data=False)
        # read from the graph's external data: the constants that may be a table, and the scalars and
        # quantization parameters that decode or scale one; never the rest of the weights
        params = {i for n in model.graph.node if n.op_type == "DequantizeLinear" for i in n.input[1:]}
        inits = {i.name: numpy_helper.to_array(i, base_dir=str(graph.parent)) for i in model.graph.initializer
                 if may_hold_table(i.dims, component.tables) or math.prod(i.dims) == 1 or i.name in params}
        encoded = {}  # constant name -> (array as the HTP stores it, decode to float32)
        for node in model.graph.node:
            if node.op_type == "DequantizeLinear" and node.input[0] in inits:
                scale = inits[node.input[1]].astype(np.float32)
                zero = inits[node.input[2]].astype(np.float32) if len(node.input) > 2 and node.input[2] else np.float32(0)
                axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
                encoded[node.input[0]] = (inits[node.input[0]], partial(dequantize, scale=scale, zero=zero, axis=axis))
        for name, array in inits.items():
            if name not in encoded and array.dtype.kind == "f":
                encoded[name] = (array.astype(np.float16), lambda a: a.astype(np.float32))
        for name, factor in gathered_then_scaled(model, inits):  # the HTP folds the scale into the table
            encoded[f"{name} x {factor:g}"] = ((inits[name].astype(np.float32) * factor).astype(np.float16),
                                              lambda a, factor=factor: a.astype(np.float32) / factor)
        data = context_binary(files[0]).read_bytes()
        found = {}
        looked_for = {}
        for name, (raw, _) in encoded.items():
            rows = raw.reshape(-1, raw.shape[-1]) if raw.ndim >= 2 else raw  # a stack of tables as its rows
            if may_hold_table(raw.shape, component.tables) and rows.ndim == 2 and rows.shape[0] >= 16 and raw.dtype.itemsize <= 2:
                looked_for[name] = rows
        for name, stored in located_all(data, looked_for).items():
            if stored is not None:
                raw, decode = encoded[name]
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
                       **_target) -> Mapping[str, StoredTensor] | None:
        """The `.dlc` sidecar, which nothing here runs: every weight of the graph it was written from
        (for fp16 the fp32 graph, made again, with its `half_weight_names` in fp16; the QDQ graph for
        the quantized schemes, made again as for the scheme reference) must be in the .dlc's tensor
        data byte for byte, as stored or in QAIRT's layout (`QAIRT_LAYOUTS`). An fp16 weight is looked
        for as the fp32 weight rounded to the nearest fp16 here, and read back as those fp16 values:
        its figure is the rounding's SNR against the fp32 weight. A changed byte in a weight makes
        that weight missing: its figure is -inf dB and the entry fails. The context binary's weights
        are covered by its parity run instead (None). Each weight is read from the graph's external
        data when it is scored, one at a time (`ReadOnDemand`)."""
        import numpy as np
        import onnx
        from onnx import helper, numpy_helper

        if files[0].suffix != ".dlc":
            return self._binary_tables(component, files, precision, calibration_size)
        graph, _ = GRAPHS.get(component, precision, calibration_size)
        model = onnx.load(str(graph), load_external_data=False)  # each weight is read from the file when it is scored
        data = dlc_members(files[0])["model.params.bin"]
        quantized = {n.input[0] for n in model.graph.node if n.op_type == "DequantizeLinear"}
        scales = {i for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear") for i in n.input[1:]}
        folded = folded_constants(model.graph)
        half = set() if precision in SCHEMES else half_weight_names(model.graph)
        inits = {init.name: init for init in model.graph.initializer  # the weights, as their arrays would say
                 if math.prod(init.dims) >= 2 and (init.name in quantized or (
                     helper.tensor_dtype_to_np_dtype(init.data_type).kind == "f" and init.name not in scales))}

        def read(name: str) -> StoredTensor:
            array = numpy_helper.to_array(inits[name], base_dir=str(graph.parent))
            held = array.astype(np.float16) if name in half else array  # what the .dlc should hold
            layouts = [held, *(held.transpose(p) for p in QAIRT_LAYOUTS.get(held.ndim, ()))]
            stored = any(data.find(np.ascontiguousarray(a).tobytes()) >= 0 for a in layouts)
            values = array.astype(np.float32)
            if not stored and name in folded:
                return StoredTensor(FOLDED, None, values, readable=False)
            return StoredTensor(f"{held.dtype} in model.params.bin", held.astype(np.float32) if stored else None, values)

        return ReadOnDemand(list(inits), read)

    def before_lowering(self, component: Component, precision: str, *, calibration_size: int | None = None, **_target) -> None:
        """The graph to compile (`GRAPHS`), made in the job's process: the lowering's process reads
        it from there, and so do the scheme reference and the stored-tensor checks after it, which
        made it a second time when only the lowering's process had (the tiny predictor frame's fp32
        ONNX export is minutes)."""
        GRAPHS.get(component, precision, calibration_size)

    def export(self, component: Component, precision: str, dest: Path, *, soc_model: int, htp_arch: int,
               calibration_size: int | None = None) -> ExportResult:
        details = {"qairt": qairt_version(), "onnxruntime_qnn": plugin_version(), "soc_model": soc_model,
                   "htp_arch": f"v{htp_arch}"}
        stem = dest.name.removesuffix(self.extension)
        dlc = dest.with_name(f"{stem}.dlc")
        graph, quantization = GRAPHS.get(component, precision, calibration_size)
        details.update(quantization)
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            htp_session(graph, soc_model=soc_model, htp_arch=htp_arch, fp16=True, context_out=dest)
            if precision in SCHEMES:
                details["qdq_graph_sha256"] = _record_digest(dest, graph)
            dumps = Path(tmp) / "dlc"
            dumps.mkdir()
            # fp16: the graph with its weights in fp16 (`half_weights`), so the .dlc stores what the HTP runs
            source = graph if precision in SCHEMES else half_weights(graph, Path(tmp) / f"{component.name}.fp16-weights.onnx")
            htp_session(source, soc_model=soc_model, htp_arch=htp_arch, fp16=True, dlc_dir=dumps,
                        fold_constants=precision in SCHEMES)
            written = sorted(dumps.glob("*.dlc"))
            if len(written) != 1:
                raise RuntimeError(f"QNN IR backend wrote {len(written)} .dlc files, expected one graph")
            runnable = [dest, context_binary(dest)]
            too_large = oversized(written[0], sum(f.stat().st_size for f in runnable))
            if too_large is None:
                shutil.move(written[0], dlc)
        if too_large is not None:
            return ExportResult(runnable, "float32", details, sidecars_not_written={"qnn-dlc": too_large})
        dlc_entry = Sidecar([dlc], "qnn-dlc", self.backend, reason=DLC_UNRUN)
        return ExportResult(runnable, "float32", details, sidecars=[dlc_entry])


def _float_graph_parity(component: Component, graph: Path) -> dict:
    """The fp32 ONNX graph run on ONNX Runtime CPU against eager, gated at the fp32 gate."""
    from ..parity.check import measure
    from ..parity.gates import DEFAULT_DB
    from ..parity.runtimes import RUNTIMES

    runtime = RUNTIMES.get("onnxruntime")
    report = measure(component, runtime.load([graph]), runtime.name, "float32", DEFAULT_DB["fp32"])
    return {"min_snr_db": report.min_snr_db, "threshold_db": report.threshold_db, "verdict": report.verdict,
            "failures": report.failures, "gate": report.gate}
