"""QNN HTP context binaries run by ONNX Runtime's QNN execution provider in QAIRT's x86 HTP
simulator: the compiled binary itself executes, bit-for-bit deterministic, but not on a phone, so
parity obtained here is labelled `simulated`."""

from __future__ import annotations

from pathlib import Path

from ...qnn import htp_session, plugin_version, qairt_version
from ...toolchain import ensure_installed
from . import RUNTIMES
from .base import SMOKE_INPUT, Runtime, Session, check_smoke
from .onnxruntime import OrtSession, smoke_model


SMOKE_TARGET = "s25-htp"


@RUNTIMES.register("qnn-htp")
class QnnHtpSimulator(Runtime):
    name = "qnn-htp-simulator"
    requires = ("onnxruntime_qnn",)
    method = "simulated"

    def load(self, files: list[Path], threads: int | None = None) -> Session:
        ensure_installed("onnxruntime_qnn", "running QNN HTP context binaries")
        return OrtSession(htp_session(files[0], threads=threads))

    def smoke(self, workdir: Path) -> str:
        """Registers the plugin, loads QAIRT's HTP backend and runs a 1-node model in its simulator
        (fp32 in, fp16 on the HTP)."""
        from ...targets import get_target

        ensure_installed("onnxruntime_qnn", "running QNN HTP context binaries")
        soc = get_target(SMOKE_TARGET).exporter_options["qnn"]  # fp16 on the HTP needs a SoC
        check_smoke(OrtSession(htp_session(smoke_model(workdir / "smoke.onnx"), fp16=True, threads=1, **soc)).run([SMOKE_INPUT]))
        return f"ran a 1-node ONNX model on the QNN HTP backend (x86 simulator, {SMOKE_TARGET}'s SoC)"

    def version(self) -> str | None:
        return f"onnxruntime-qnn {plugin_version()} (QAIRT {qairt_version()})"
