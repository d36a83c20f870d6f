"""QNN HTP context binaries run by ONNX Runtime's QNN execution provider in QAIRT's x86 HTP
simulator: the compiled binary itself executes, bit-for-bit deterministic, but not on a phone, so
parity obtained here is labelled `simulated`."""

from __future__ import annotations

from pathlib import Path

from ...qnn import htp_session, plugin_version, qairt_version
from ...toolchain import ensure_installed
from . import RUNTIMES
from .base import Runtime, Session
from .onnxruntime import OrtSession


@RUNTIMES.register("qnn-htp")
class QnnHtpSimulator(Runtime):
    name = "qnn-htp-simulator"
    method = "simulated"

    def load(self, files: list[Path], threads: int | None = None) -> Session:
        ensure_installed("onnxruntime_qnn", "running QNN HTP context binaries")
        return OrtSession(htp_session(files[0], threads=threads))

    def version(self) -> str | None:
        return f"onnxruntime-qnn {plugin_version()} (QAIRT {qairt_version()})"
