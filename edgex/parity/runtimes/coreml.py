"""Core ML: real prediction on macOS, edgex's reference interpreter everywhere else.

Core ML prediction exists only on macOS (coremltools ships no Linux runtime), so on other systems
the saved `.mlpackage` itself is executed by `edgex.parity.mil` and parity is labelled `simulated`
with the interpreter named. An op the interpreter cannot evaluate raises `Unsupported`, which the
parity check turns into method `none` naming the op.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Sequence

import numpy as np

from ...toolchain import ensure_installed, version
from . import RUNTIMES
from .base import SMOKE_INPUT, Runtime, Session, Unsupported, check_smoke


def package_root(files: list[Path]) -> Path:
    """The `.mlpackage` folder: given itself (fresh export) or its files (from a manifest)."""
    for path in (Path(files[0]), *Path(files[0]).parents):
        if path.suffix == ".mlpackage":
            return path
    raise ValueError(f"{files[0]} is not inside an .mlpackage")


def _on_macos() -> bool:
    return platform.system() == "Darwin"


class _Predict(Session):
    """Core ML's own prediction (macOS). Inputs and outputs are matched by position."""

    def __init__(self, model):
        self._model = model
        spec = model.get_spec().description
        self._inputs = [i.name for i in spec.input]
        self._outputs = [o.name for o in spec.output]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = {n: (x.astype(np.int32) if np.issubdtype(x.dtype, np.integer) else x) for n, x in zip(self._inputs, inputs)}
        result = self._model.predict(feeds)
        return [np.asarray(result[n]) for n in self._outputs]


class _Interpret(Session):
    def __init__(self, interpreter):
        self._interpreter = interpreter

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        from ..mil import UnsupportedOp

        try:
            return self._interpreter.run(inputs)
        except UnsupportedOp as exc:
            raise Unsupported(str(exc)) from None


@RUNTIMES.register("coreml")
class CoreMLRuntime(Runtime):
    name = "coreml"
    requires = ("coremltools",)

    @property
    def method(self) -> str:
        return "runtime" if _on_macos() else "simulated"

    @property
    def simulator(self) -> str | None:
        from ..mil import INTERPRETER

        return None if _on_macos() else INTERPRETER

    def load(self, files: list[Path], threads: int | None = None) -> Session:
        ensure_installed("coremltools", "running .mlpackage artifacts")
        import coremltools as ct

        package = package_root(files)
        if _on_macos():
            return _Predict(ct.models.MLModel(str(package), compute_units=ct.ComputeUnit.ALL))
        from ..mil import MilInterpreter, UnsupportedOp

        try:
            return _Interpret(MilInterpreter(package))
        except UnsupportedOp as exc:
            raise Unsupported(str(exc)) from None

    def smoke(self, workdir: Path) -> str:
        """Writes x + 1 as an ML program `.mlpackage` with coremltools' MIL builder and runs it as
        `load` would: Core ML's prediction on macOS, edgex's MIL interpreter elsewhere."""
        ensure_installed("coremltools", "running .mlpackage artifacts")
        import coremltools as ct
        from coremltools.converters.mil import Builder as mb
        from coremltools.converters.mil.mil import types

        @mb.program(input_specs=[mb.TensorSpec(shape=SMOKE_INPUT.shape, dtype=types.fp32)])
        def add_one(x):
            return mb.add(x=x, y=1.0, name="y")

        path = workdir / "smoke.mlpackage"
        ct.convert(add_one, convert_to="mlprogram", compute_precision=ct.precision.FLOAT32).save(str(path))
        check_smoke(self.load([path]).run([SMOKE_INPUT]))
        where = "Core ML prediction" if _on_macos() else f"{self.simulator} (Core ML itself predicts only on macOS)"
        return f"ran an x + 1 ML program through {where}"

    def version(self) -> str | None:
        return version("coremltools")
