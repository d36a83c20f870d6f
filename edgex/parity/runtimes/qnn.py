"""QNN HTP context binaries run by ONNX Runtime's QNN execution provider in QAIRT's x86 HTP
simulator: the compiled binary itself executes, bit-for-bit deterministic, but not on a phone, so
parity obtained here is labelled `simulated`."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ...qnn import htp_session, plugin_version, qairt_version
from ...toolchain import ensure_installed
from . import RUNTIMES
from .base import Runtime, Session


class _Session(Session):
    def __init__(self, session):
        self._session = session
        self._inputs = [i.name for i in session.get_inputs()]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return self._session.run(None, dict(zip(self._inputs, inputs)))


@RUNTIMES.register("qnn-htp")
class QnnHtpSimulator(Runtime):
    name = "qnn-htp-simulator"
    method = "simulated"

    def load(self, files: list[Path], threads: int | None = None) -> Session:
        ensure_installed("onnxruntime_qnn", "running QNN HTP context binaries")
        return _Session(htp_session(files[0], threads=threads))

    def version(self) -> str | None:
        return f"onnxruntime-qnn {plugin_version()} (QAIRT {qairt_version()})"
