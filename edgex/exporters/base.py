"""Exporter: lowers one component to one format in one precision. No model names in here.

Exporter modules are light on import: the registry reads their class attributes (name, format,
precisions, ...) to check a command line, so torch and the toolchain are imported inside the
methods that use them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EdgexError

if TYPE_CHECKING:
    import torch

    from ..component import Component


@dataclass
class ExportResult:
    files: list[Path]  # primary artifact first
    io_float_dtype: str  # dtype of the artifact's float inputs/outputs ("float32" / "float16")
    details: dict = field(default_factory=dict)


class Exporter(ABC):
    name: str  # registry name, e.g. "executorch"
    format: str  # artifact format, e.g. "pte"
    backend: str  # delegate / execution provider, e.g. "xnnpack"
    extension: str
    runtime: str  # runtime adapter that runs this format for parity
    precisions: tuple[str, ...]
    schemes: dict[str, str]  # precision -> what it means in this format, one line (a test checks both agree)
    requires: tuple[str, ...]  # importable modules (see toolchain.TOOLCHAINS)

    def check(self, precision: str) -> None:
        from ..toolchain import ensure_installed

        if precision not in self.precisions:
            raise EdgexError(
                f"exporter {self.name} does not support precision {precision!r} (supports: {', '.join(self.precisions)})"
            )
        for module in self.requires:
            ensure_installed(module, f"exporting {self.format}")

    @abstractmethod
    def export(self, component: Component, precision: str, dest: Path) -> ExportResult:
        """Write the artifact at `dest` (+ any side files beside it) and describe it."""


def float_dtype(precision: str) -> torch.dtype:
    import torch

    return torch.float16 if precision == "fp16" else torch.float32


def cast_inputs(inputs, dtype: torch.dtype) -> tuple:
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
