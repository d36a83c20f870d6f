"""ONNX via torch.export (the dynamo exporter), weights in one external-data file beside it.

fp16 exports the half-precision module, so the graph computes in fp16 end to end (float inputs
and outputs are float16), which is what an fp16 ONNX deployment runs.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import torch

from ..component import Component
from . import EXPORTERS
from .base import ExportResult, Exporter, cast_inputs, float_dtype


@EXPORTERS.register("onnx")
class OnnxExporter(Exporter):
    name = "onnx"
    format = "onnx"
    backend = "onnxruntime-cpu"
    extension = ".onnx"
    runtime = "onnxruntime"
    precisions = ("fp32", "fp16")
    requires = ("onnx", "onnxscript")

    def export(self, component: Component, precision: str, dest: Path) -> ExportResult:
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
