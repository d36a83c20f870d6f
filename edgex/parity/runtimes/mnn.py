"""MNN runtime, CPU, through MNN's Module API (`MNN.nn`; never `MNN.tools`).

MNN has no int64 tensors: ONNX int64 inputs become int32, so integer inputs are fed as int32
(feeding int64 bytes is silently misread)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ...toolchain import ensure_installed, native_output_silenced, version
from . import RUNTIMES
from .base import SMOKE_INPUT, Runtime, Session, check_smoke


class _Session(Session):
    def __init__(self, module, expr):
        self._module = module
        self._expr = expr

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        F = self._expr
        feeds = []
        for x in inputs:
            if np.issubdtype(x.dtype, np.integer):
                feeds.append(F.const(np.ascontiguousarray(x, np.int32), list(x.shape), F.NCHW, F.int))
            else:
                feeds.append(F.const(np.ascontiguousarray(x, np.float32), list(x.shape), F.NCHW, F.float))
        return [np.array(out.read(), copy=True) for out in self._module.forward(feeds)]


@RUNTIMES.register("mnn")
class MnnRuntime(Runtime):
    name = "mnn"
    requires = ("MNN",)

    def load(self, files: list[Path], threads: int | None = None) -> Session:
        ensure_installed("MNN", "running .mnn artifacts")
        with native_output_silenced():  # MNN prints its CPU features and precision on stdout
            import MNN.expr as F
            import MNN.nn as nn

            config = {"backend": "CPU", "numThread": threads or 2, "precision": "high"}
            manager = nn.create_runtime_manager((config,))
            module = nn.load_module_from_file(str(files[0]), [], [], runtime_manager=manager)
        return _Session(module, F)

    def smoke(self, workdir: Path) -> str:
        """Builds x + 1 with MNN's expression API, saves it as a .mnn and runs it as `load` would."""
        ensure_installed("MNN", "running .mnn artifacts")
        with native_output_silenced():
            import MNN.expr as F

            x = F.placeholder(list(SMOKE_INPUT.shape), F.NCHW, F.float)
            x.name = "x"
            y = F.add(x, F.const(np.ones(SMOKE_INPUT.shape, np.float32), list(SMOKE_INPUT.shape), F.NCHW, F.float))
            y.name = "y"
            path = workdir / "smoke.mnn"
            F.save([y], str(path))
        check_smoke(self.load([path], 1).run([SMOKE_INPUT]))
        return "ran a saved x + 1 .mnn module on the CPU backend"

    def version(self) -> str | None:
        return version("MNN")
