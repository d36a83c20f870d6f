"""Runtime: runs an artifact on this machine and returns numpy outputs, or says why it cannot."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Sequence

import numpy as np


class Unsupported(Exception):
    """This artifact cannot be run here (e.g. an op a reference interpreter does not implement):
    parity is then reported as method `none` with this reason, never as a pass."""


class Session(ABC):
    # Milliseconds per phase of the last `run`, for runtimes whose call wraps more than the graph
    # (llama.cpp: writing the state inputs into its cache, the decode itself, reading the cache back);
    # benchmarks report them beside the whole call.
    phases: dict[str, float] = {}

    @abstractmethod
    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Inputs in the artifact's own dtypes, in declared order; outputs in declared order."""

    def cannot_run(self, inputs: Sequence[np.ndarray]) -> str | None:
        """Why this artifact cannot take these inputs at all, or None: a runtime whose graph owns
        what the component takes as an input (libmtmd draws its own samples, so a sample drawn
        with the runner's noise cannot be fed). Parity records such a sample as not run, with the
        reason; a component none of whose samples runs fails."""
        return None


# The smoke program every runtime runs for `edgex doctor`: y = x + 1 on these values.
SMOKE_INPUT = np.array([[-2.0, 0.0, 0.5, 3.0]], np.float32)


def check_smoke(outputs: Sequence[np.ndarray]) -> None:
    """Raise unless a smoke program returned SMOKE_INPUT + 1, to fp16 rounding (the QNN HTP
    simulator's fp16 path is 1 fp32 ulp off on these exact values)."""
    got = np.asarray(outputs[0], np.float32).reshape(SMOKE_INPUT.shape)
    if not np.allclose(got, SMOKE_INPUT + 1, rtol=1e-3, atol=1e-3):
        raise RuntimeError(f"the x + 1 smoke program returned {got.tolist()} for x = {SMOKE_INPUT.tolist()}")


class Runtime(ABC):
    name: str
    method: str = "runtime"  # how parity obtained by this adapter is labelled in the manifest
    simulator: str | None = None  # the interpreter / simulator that ran the artifact, when "simulated"
    required: bool = False  # a core dependency's runtime: `edgex doctor` fails when it is missing, too
    requires: tuple[str, ...] = ()  # importable modules it runs artifacts with (see toolchain.TOOLCHAINS)

    def unavailable_reason(self) -> str | None:
        """None when this machine can run the format, else a one-line reason."""
        return None

    @abstractmethod
    def load(self, files: list[Path], threads: int | None = None) -> Session:
        ...

    def build_variant(self) -> str | None:
        """What this runtime's build chose for this host beyond the CPU features (`edgex.host`), where
        that can move a figure: llama.cpp's CPU backend and the instruction sets it was compiled
        for. In the key of every artifact this runtime gates (`edgex.artifacts.keys`); None where
        there is nothing more to say, or the runtime is not installed."""
        return None

    def accumulates_in_half(self) -> bool:
        """Whether this runtime sums fp16 matrix products in an fp16 accumulator on this machine
        (`edgex.parity.half_arithmetic`); runtimes that compute fp16 ops in fp32 do not."""
        return False

    def smoke(self, workdir: Path) -> str:
        """Load this runtime's library and run a tiny program through it (x + 1 on SMOKE_INPUT,
        checked with `check_smoke`), so `edgex doctor` reports what actually ran, not what imports.
        Returns a short note of what ran; raises EdgexError when the toolchain is not installed
        and any other exception when it is installed but broken. Files go under `workdir`.
        A runtime without one is reported failed: nothing shows that it works."""
        raise NotImplementedError(f"runtime {self.name} has no smoke program")

    def version(self) -> str | None:
        return None
