"""Component: one separately deployable graph, declared as data.

Everything downstream (export, parity, manifest, summary table, contract tests) reads the same
declaration, so a shape or an output name is written once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

# What an output means, which decides how parity scores it.
SIGNAL = "signal"  # continuous values: SNR / PSNR / cosine
LOGITS = "logits"  # SNR plus top-1 agreement along the last axis
TOKENS = "tokens"  # integer ids: exact agreement


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # "float32" or "int64"
    kind: str = SIGNAL
    # For graphs that feed their own sampled tokens back (the code predictor): the TOKENS output
    # whose earlier steps condition this output's later steps along axis 1. Parity compares such an
    # output only up to the first token that differs (teacher-forced prefix); past that point the
    # artifact and the reference are running on different inputs.
    conditioned_on: str | None = None

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith("float")

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "kind": self.kind,
                **({"conditioned_on": self.conditioned_on} if self.conditioned_on else {})}


Inputs = tuple[torch.Tensor, ...]


DEFAULT_CALIBRATION_SIZE = 8  # calibration input sets a component draws unless it or the user says otherwise


@dataclass
class Component:
    """A graph to export plus what it must equal.

    `module` is the export-friendly wrapper; `reference` runs the unmodified eager model on the same
    inputs. Parity always compares an artifact with `reference`, never with `module`.
    `samples` are named input sets drawn from the eager pipeline: the first is the example used for
    export, the others are held out for parity (and never used to calibrate).
    `calibration(n)` draws `n` further input sets from the eager pipeline for quantizers that need
    representative activations; it must never return a sample's inputs. `calibration_size` is the
    `n` a quantizer uses unless the user asks for another (`--calibration`): enough sets to cover
    every position the graph takes (one per step for a graph that runs once per step).
    `layouts` maps a format to the file layout the component declares for it, where the format's
    runtime dictates names and conventions per architecture (GGUF: `edgex.layouts.GgufLayout`).
    `float_only` are module-name patterns (fnmatch, relative to `module`, e.g. "*.g_proj") that
    every quantized scheme must leave in float: layers a model is known to break on when quantized.
    """

    name: str
    role: str
    module: nn.Module
    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    reference: Callable[..., Inputs]
    samples: dict[str, Inputs]
    description: str = ""
    metadata: dict = field(default_factory=dict)
    calibration: Callable[[int], list[Inputs]] | None = None
    calibration_size: int = DEFAULT_CALIBRATION_SIZE
    layouts: dict = field(default_factory=dict)
    float_only: tuple[str, ...] = ()

    _reference_outputs: dict = field(default_factory=dict, repr=False)

    def reference_outputs(self, sample: str) -> Inputs:
        """The eager reference on a named sample, computed once and shared by every artifact."""
        if sample not in self._reference_outputs:
            with torch.no_grad():
                self._reference_outputs[sample] = tuple(self.reference(*self.samples[sample]))
        return self._reference_outputs[sample]

    @property
    def example_inputs(self) -> Inputs:
        return next(iter(self.samples.values()))

    def check_inputs(self, inputs: Inputs) -> None:
        """Fail early if a sample does not match the declared static specs."""
        if len(inputs) != len(self.inputs):
            raise ValueError(f"{self.name}: {len(inputs)} inputs, spec declares {len(self.inputs)}")
        for tensor, spec in zip(inputs, self.inputs):
            if tuple(tensor.shape) != spec.shape or str(tensor.dtype).removeprefix("torch.") != spec.dtype:
                raise ValueError(
                    f"{self.name}.{spec.name}: got {tuple(tensor.shape)} {tensor.dtype}, spec {spec.shape} {spec.dtype}"
                )
