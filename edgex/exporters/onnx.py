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
                optimize=True,
                verbose=False,
            )
        program.save(str(dest), external_data=True)
        data = dest.with_name(dest.name + ".data")
        files = [dest] + ([data] if data.exists() else [])
        opset = program.model_proto.opset_import[0].version
        return ExportResult(files, str(dtype).removeprefix("torch."), {"opset": opset})


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
