"""Component: one separately deployable graph, declared as data.

Everything downstream (export, parity, manifest, summary table, contract tests) reads the same
declaration, so a shape or an output name is written once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from .patches.torch_utils import tree_leaves

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
    # A TOKENS output the graph samples itself: (LOGITS output, noise input or None). The sampling
    # scores are those logits (+ that noise), argmax over the last axis. Parity re-derives the
    # reference's own choice from the reference's scores and lets a differing token pass only as a
    # near-tie of them (`edgex.parity.check`).
    sampled_from: tuple[str, str | None] | None = None

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith("float")

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "kind": self.kind,
                **({"sampled_from": list(self.sampled_from)} if self.sampled_from else {})}


Inputs = tuple[torch.Tensor, ...]
# Where a state output is written by a call: a numpy index (tuple of slices / index arrays) into the
# output, from the call's inputs. Parity scores those entries apart from the copied rest.
WrittenIndex = Callable[[Inputs], tuple]


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
    `forced_reference(inputs, {tokens output: tensor})` runs the unmodified eager reference with
    those sampled TOKENS outputs forced to the given values (teacher forcing on an artifact's own
    tokens) and returns every output, the tokens being the forced ones: once an artifact samples a
    different token, the rest of its outputs can still be compared on the same history.
    `written` maps a state output (KV cache, ring) to the entries a call writes (`WrittenIndex`):
    the rest of such an output is a copy of an input, and scoring it with the written part would
    inflate the SNR.
    `tables` are the gather tables the graph stores (token / codec embeddings, codebooks), by name,
    as the eager tensors the graph reads rows of. The parity samples read a few of their rows (a
    Spark-X2.5 decode call reads 1 of 131072), so every format reads them back from the written
    file and scores them row by row at export and in `edgex verify` (`edgex.parity.tensors`).
    `spectral` names the waveform outputs gated by their phase-insensitive spectral figure instead
    of their SNR (the recipe's `RecipeFacts.spectral_outputs`).
    `actions` maps an output holding actions in the policy's own units (unnormalized) to each
    action dimension's spread in the policy's data (its standard deviation): parity scores it by
    its action error too (`metrics.action_error`, gated at `gates.ACTION_ERROR`).
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
    forced_reference: Callable[[Inputs, dict[str, torch.Tensor]], Inputs] | None = None
    written: dict[str, WrittenIndex] = field(default_factory=dict)
    tables: dict[str, torch.Tensor] = field(default_factory=dict)
    spectral: tuple[str, ...] = ()
    actions: dict[str, tuple[float, ...]] = field(default_factory=dict)

    _reference_outputs: dict = field(default_factory=dict, repr=False)
    _reads: dict = field(default_factory=dict, repr=False)

    def computed(self) -> dict[str, dict]:
        """What this component has computed and keeps (reference outputs, tensors read), by cache: a
        job run in another process (`edgex.isolation`) hands back what it added, so the next job
        does not compute it again."""
        return {"_reference_outputs": dict(self._reference_outputs), "_reads": dict(self._reads)}

    def added_since(self, before: dict[str, dict]) -> dict[str, dict]:
        """The entries of `computed()` that `before` (an earlier `computed()`) did not have."""
        return {cache: {k: v for k, v in now.items() if k not in before[cache]} for cache, now in self.computed().items()}

    def adopt(self, added: dict[str, dict]) -> None:
        for cache, entries in added.items():
            getattr(self, cache).update(entries)

    def reference_outputs(self, sample: str) -> Inputs:
        """The eager reference on a named sample, computed once and shared by every artifact."""
        if sample not in self._reference_outputs:
            with torch.no_grad():
                self._reference_outputs[sample] = tuple(self.reference(*self.samples[sample]))
        return self._reference_outputs[sample]

    def compute_references(self, reads: bool = False) -> None:
        """Every sample's reference outputs; with `reads`, also `reference_reads` and `module_reads`,
        the reads taken in the same pass over the samples as the outputs rather than in a second
        one that every job needing them would run again on its one core."""
        if not reads or "reference" in self._reads:
            for sample in self.samples:
                self.reference_outputs(sample)
        else:
            def run(sample: str) -> None:
                outputs = tuple(self.reference(*self.samples[sample]))
                self._reference_outputs.setdefault(sample, outputs)

            self._reads["reference"] = tensors_read(self.module, [lambda s=s: run(s) for s in self.samples])
        if reads:
            self.module_reads()

    def keep_reference_outputs(self, sample: str, outputs: Inputs) -> None:
        """Outputs of the eager reference on a named sample that the recipe already ran (to declare
        the output specs): parity reuses them instead of running the eager model on it again."""
        self._reference_outputs[sample] = tuple(outputs)

    def eager(self, inputs: Inputs, forced: dict[str, torch.Tensor] | None = None) -> Inputs:
        """The eager reference as parity calls it, `(inputs, forced tokens | None) -> outputs`:
        free-running (cached for the component's own samples) or teacher-forced on `forced`."""
        if forced:
            if self.forced_reference is None:
                raise ValueError(f"{self.name}: tokens {', '.join(forced)} cannot be forced (no forced_reference)")
            with torch.no_grad():
                return tuple(self.forced_reference(inputs, forced))
        for sample, sample_inputs in self.samples.items():
            if sample_inputs is inputs:
                return self.reference_outputs(sample)
        with torch.no_grad():
            return tuple(self.reference(*inputs))

    def module_reads(self) -> set[int]:
        """ids of the module's parameters and buffers its forward reads on the example inputs: the
        tensors torch.export (which traces those inputs) can put in a graph. A wrapper may hold far
        more than its graph reads (a Qwen3-TTS talker graph holds the whole talker, its text
        embedding and code predictor included), and casting the rest only costs memory."""
        if "module" not in self._reads:
            self._reads["module"] = tensors_read(self.module, [lambda: self.module(*self.example_inputs)])
        return self._reads["module"]

    def reference_reads(self) -> set[int]:
        """ids of the module's parameters and buffers the eager reference reads on any sample (a
        step graph's reference reads one head per step: every sample is run)."""
        if "reference" not in self._reads:
            runs = [lambda s=s: self.reference(*s) for s in self.samples.values()]
            self._reads["reference"] = tensors_read(self.module, runs)
        return self._reads["reference"]

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


def tensors_read(module: nn.Module, calls: Sequence[Callable[[], object]]) -> set[int]:
    """ids of `module`'s parameters and buffers passed to any torch function while `calls` run
    (a `TorchFunctionMode` sees every tensor argument, direct attribute reads such as
    `table.weight[:n]` included, not only modules' own forwards)."""
    from torch.overrides import TorchFunctionMode

    owned = {id(t) for t in (*module.parameters(), *module.buffers())}
    read: set[int] = set()

    class _Reads(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            read.update(i for i in map(id, tree_leaves((args, kwargs or {}))) if i in owned)
            return func(*args, **(kwargs or {}))

    with torch.no_grad(), _Reads():
        for call in calls:
            call()
    return read
