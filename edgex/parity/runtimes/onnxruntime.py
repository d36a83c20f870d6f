"""ONNX Runtime, CPU execution provider."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ...toolchain import require, version
from . import RUNTIMES
from .base import Runtime, Session


class OrtSession(Session):
    """Any onnxruntime.InferenceSession, fed in declared input order (also used by the QNN runtime)."""

    def __init__(self, session):
        self._session = session
        self._inputs = [i.name for i in session.get_inputs()]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self._session.run(None, dict(zip(self._inputs, inputs)))


@RUNTIMES.register("onnxruntime")
class OnnxRuntime(Runtime):
    name = "onnxruntime"

    def load(self, files: list[Path], threads: int | None = None) -> Session:
        ort = require("onnxruntime", "running .onnx artifacts")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
        session = ort.InferenceSession(str(files[0]), options, providers=["CPUExecutionProvider"])
        return OrtSession(session)

    def version(self) -> str | None:
        return version("onnxruntime")
