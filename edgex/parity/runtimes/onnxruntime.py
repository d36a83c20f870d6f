"""ONNX Runtime, CPU execution provider."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from ...exporters.onnx import SLICED_INPUTS, sliced_feed
from ...toolchain import require, version
from . import RUNTIMES
from .base import SMOKE_INPUT, Runtime, Session, check_smoke


def smoke_model(path: Path) -> Path:
    """A one-node ONNX model, y = x + 1 on SMOKE_INPUT's shape, written to `path`."""
    onnx = require("onnx", "building the ONNX smoke model")
    from onnx import TensorProto, helper, numpy_helper

    shape = list(SMOKE_INPUT.shape)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])], "edgex_smoke",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(np.ones(shape, np.float32), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


class OrtSession(Session):
    """Any onnxruntime.InferenceSession, fed in declared input order (also used by the QNN runtime).

    A stacked input the exporter sliced (`edgex.exporters.onnx.SLICED_INPUTS` in the model's
    metadata) is still given whole, under its own name and in its place; each slice is fed as a
    view of it, so nothing is copied."""

    def __init__(self, session):
        self._session = session
        self._sliced = json.loads(session.get_modelmeta().custom_metadata_map.get(SLICED_INPUTS, "{}"))
        parts = {f"{name}.{i}" for name, count in self._sliced.items() for i in range(1, count)}
        self._inputs = [i.name.removesuffix(".0") if i.name.removesuffix(".0") in self._sliced else i.name
                        for i in session.get_inputs() if i.name not in parts]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self.run_named(dict(zip(self._inputs, inputs)))

    def run_named(self, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
        """`run` with the inputs by name (the component's names, stacked inputs whole)."""
        return self._session.run(None, sliced_feed(arrays, self._sliced))


@RUNTIMES.register("onnxruntime")
class OnnxRuntime(Runtime):
    name = "onnxruntime"
    requires = ("onnxruntime",)
    required = True

    def load(self, files: list[Path], threads: int | None = None) -> Session:
        ort = require("onnxruntime", "running .onnx artifacts")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(files[0]), options, providers=["CPUExecutionProvider"])
        return OrtSession(session)

    def smoke(self, workdir: Path) -> str:
        check_smoke(self.load([smoke_model(workdir / "smoke.onnx")], 1).run([SMOKE_INPUT]))
        return "ran a 1-node ONNX model on the CPU execution provider"

    def version(self) -> str | None:
        return version("onnxruntime")
