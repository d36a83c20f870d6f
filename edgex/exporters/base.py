"""Exporter: lowers one component to one format in one precision. No model names in here."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..component import Component
from ..errors import EdgexError

if TYPE_CHECKING:
    from ..parity.scheme import StoredScheme


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

    def stored_scheme(self, component: Component, precision: str, files: list[Path], **options) -> "StoredScheme | None":
        """The numeric scheme of an artifact this exporter wrote: the weights its files store,
        dequantized, with the float values they were made from, plus activation quantization
        (`edgex.parity.scheme`). Read from `files` where the format allows it; otherwise the same
        scheme applied in PyTorch, saying so in `StoredScheme.source`. `options` are the keyword
        options the artifact was exported with (e.g. its calibration size). fp16 files store their
        weights rounded to half, which is the default here (`edgex.parity.scheme.rounded_to_fp16`).
        None for fp32, where any error is the lowering's."""
        from ..parity.scheme import rounded_to_fp16

        return rounded_to_fp16(component) if precision == "fp16" else None


def float_dtype(precision: str) -> torch.dtype:
    return torch.float16 if precision == "fp16" else torch.float32


def cast_inputs(inputs, dtype: torch.dtype) -> tuple:
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
