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


class Runtime(ABC):
    name: str
    method: str = "runtime"  # how parity obtained by this adapter is labelled in the manifest
    simulator: str | None = None  # the interpreter / simulator that ran the artifact, when "simulated"

    def unavailable_reason(self) -> str | None:
        """None when this machine can run the format, else a one-line reason."""
        return None

    @abstractmethod
    def load(self, files: list[Path], threads: int | None = None) -> Session:
        ...

    def version(self) -> str | None:
        return None
