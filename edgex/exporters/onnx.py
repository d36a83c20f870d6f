"""ONNX via torch.export (the dynamo exporter), weights in one external-data file beside it.

fp16 exports the half-precision module, so the graph computes in fp16 end to end (float inputs
and outputs are float16), which is what an fp16 ONNX deployment runs.
"""

from __future__ import annotations

import ast
import copy
import fnmatch
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from . import EXPORTERS
from .base import ExportResult, Exporter, cast_inputs, float_dtype

if TYPE_CHECKING:
    from ..component import Component


@EXPORTERS.register("onnx")
class OnnxExporter(Exporter):
    name = "onnx"
    format = "onnx"
    backend = "onnxruntime-cpu"
    extension = ".onnx"
    runtime = "onnxruntime"
    precisions = ("fp32", "fp16")
    schemes = {  # what each precision means in this format, one line each (edgex list)
        "fp32": "float32 graph",
        "fp16": "the module cast to float16: fp16 weights and compute end to end, fp16 inputs and outputs",
    }
    requires = ("onnx", "onnxscript")

    def stored_constants(self, component: Component, files: list[Path], precision: str, **_options):
        """The graph's float initializers and Constant-node values, read by onnx (external data included)."""
        import numpy as np
        import onnx
        from onnx import numpy_helper

        graph = onnx.load(str(files[0])).graph
        arrays = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant":
                arrays.update({out: numpy_helper.to_array(a.t) for out in node.output for a in node.attribute if a.name == "value"})
        return {name: a.astype(np.float32) for name, a in arrays.items() if a.dtype.kind == "f"}

    def export(self, component: Component, precision: str, dest: Path) -> ExportResult:
        import torch

        dtype = float_dtype(precision)
        module = copy.deepcopy(component.module).eval().to(dtype)
        inputs = cast_inputs(component.example_inputs, dtype)
        for name in ("torch.onnx", "onnxscript"):
            logging.getLogger(name).setLevel(logging.ERROR)
        with torch.no_grad():
            program = torch.onnx.export(
                module,
                inputs,
                dynamo=True,
                input_names=[s.name for s in component.inputs],
                output_names=[s.name for s in component.outputs],
                optimize=False,
                verbose=False,
            )
        optimize(program.model)
        program.save(str(dest), external_data=True)
        data = dest.with_name(dest.name + ".data")
        files = [dest] + ([data] if data.exists() else [])
        opset = program.model_proto.opset_import[0].version
        return ExportResult(files, str(dtype).removeprefix("torch."), {"opset": opset})


# onnxscript's multi-output rewrite `SlicesSplit` (two Slices of one tensor -> one Split) matches
# every pair of Slice nodes: on the 15-step code predictor frame (6,000 nodes) it took 63 s of a
# 70 s rewrite pass, and the optimizer runs the pass twice (most of the frame's ONNX export time).
SKIPPED_REWRITES = frozenset({"SlicesSplit"})


def optimize(model) -> None:
    """What `torch.onnx.export(optimize=True)` runs (onnxscript's `optimize_ir`, then its ONNX
    fusions), with the default rewrite rules minus `SKIPPED_REWRITES`. The graph keeps two Slices
    where the skipped rule would write one Split: the same values, and every runtime has both ops."""
    import onnx_ir as ir
    import onnx_ir.passes.common as common
    from onnxscript import rewriter
    from onnxscript.optimizer import _constant_folding
    from onnxscript.rewriter import onnx_fusions

    defaults = [rule for entry in rewriter._DEFAULT_REWRITE_RULES for rule in getattr(entry, "rules", [entry])]
    rules = [rule for rule in defaults if rule.name not in SKIPPED_REWRITES]
    ir.passes.Sequential(
        common.InlinePass(),
        ir.passes.PassManager(
            [
                _constant_folding.FoldConstantsPass(
                    shape_inference=True,
                    input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
                    output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
                ),
                rewriter.RewritePass(rules),
                common.RemoveUnusedNodesPass(),
                common.RemoveUnusedFunctionsPass(),
                common.RemoveUnusedOpsetsPass(),
            ],
            steps=2,
            early_stop=True,
        ),
        common.RemoveUnusedNodesPass(),
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.LiftSubgraphInitializersToMainGraphPass(),
        common.DeduplicateInitializersPass(),
        common.CommonSubexpressionEliminationPass(),
        common.OutputFixPass(),
        common.NameFixPass(),
    )(model)
    onnx_fusions.fuse(model)


def nodes_from_modules(path: Path, patterns: tuple[str, ...]) -> list[str]:
    """Names of the ONNX nodes the exporter emitted for modules whose path matches one of the
    fnmatch `patterns` (read from the `pkg.torch.onnx.name_scopes` metadata each node carries)."""
    import onnx

    if not patterns:
        return []
    found = []
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        scopes = next((ast.literal_eval(p.value) for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), [])
        if any(fnmatch.fnmatch(scope, pattern) for scope in scopes for pattern in patterns):
            found.append(node.name)
    return found
