"""Exporter: lowers one component to one format in one precision. No model names in here.

Exporter modules are light on import: the registry reads their class attributes (name, format,
precisions, ...) to check a command line, so torch and the toolchain are imported inside the
methods that use them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EdgexError
from ..parity.stored import StoredTensor

if TYPE_CHECKING:
    from ..parity.scheme import Reference, StoredScheme
    import numpy as np
    import torch

    from ..component import Component


@dataclass
class Sidecar:
    """Files an export writes beside its artifact that run apart from it (another backend session,
    other weights): the artifact's parity says nothing about them, so they get their own manifest
    entry (`sidecar_of` the artifact), parity and verdict. `runtime` names the runtime adapter that
    runs them here; None means nothing here can, and `reason` says why (method `none`)."""

    files: list[Path]  # primary file first
    format: str
    backend: str
    runtime: str | None = None
    reason: str | None = None
    io_float_dtype: str = "float32"
    details: dict = field(default_factory=dict)


@dataclass
class ExportResult:
    files: list[Path]  # primary artifact first; every file the artifact's runtime loads with it
    io_float_dtype: str  # dtype of the artifact's float inputs/outputs ("float32" / "float16")
    details: dict = field(default_factory=dict)
    sidecars: list[Sidecar] = field(default_factory=list)
    # sidecar format -> why this export wrote none (the artifact's manifest entry, `sidecars_not_written`)
    sidecars_not_written: dict[str, str] = field(default_factory=dict)


class Exporter(ABC):
    name: str  # registry name, e.g. "executorch"
    format: str  # artifact format, e.g. "pte"
    backend: str  # delegate / execution provider, e.g. "xnnpack"
    extension: str
    runtime: str  # runtime adapter that runs this format for parity
    precisions: tuple[str, ...]
    schemes: dict[str, str]  # precision -> what it means in this format, one line (a test checks both agree)
    requires: tuple[str, ...]  # importable modules (see toolchain.TOOLCHAINS)
    sidecar_formats: tuple[str, ...] = ()  # the formats of the sidecars it writes (`Sidecar.format`)
    # Whether its jobs may run in a forked child process (`edgex.isolation`). False where the
    # runtime's thread pool does not survive a fork of a process that has used it.
    fork_safe: bool = True
    # Whether its lowering is one whole-graph compile holding several times the component's weights:
    # such lowerings take turns within an export (`edgex.lowering_turns`) instead of running side by side.
    lowering_alone: bool = False
    # A job's expected cost per pass of its graph, relative to the other formats', where no cost of it
    # is recorded (`edgex.scheduler`): what orders jobs longest first, never a time.
    cost_weight: float = 1.0
    # What an export running one of its jobs needs, per byte of its model's weights in fp32, where no
    # peak of the job is recorded (`edgex.memory_needs`, which refuses an export whose largest job
    # cannot fit). 1.0 is the floor every format shares: the export's process builds the eager model's
    # fp32 weights in memory before any job starts, whatever the job lowers. A format sets more only
    # from recorded peaks, never more than the smallest of them shows: refusing a job that fits is a bug.
    memory_factor: float = 1.0

    def check(self, precision: str) -> None:
        from ..toolchain import ensure_installed

        if precision not in self.precisions:
            raise EdgexError(
                f"exporter {self.name} does not support precision {precision!r} (supports: {', '.join(self.precisions)})"
            )
        for module in self.requires:
            ensure_installed(module, f"exporting {self.format}")

    def warm_up(self) -> None:
        """Pay this exporter's one-time costs in this process: imports, and the tables its libraries
        build on first use. An export runs each job in a process forked from this one
        (`edgex.isolation`), which inherits them warm instead of paying them per job (ExecuTorch:
        8.5 s of imports and 6 s of first lowering). Default: import the modules it requires."""
        import importlib

        for module in self.requires:
            importlib.import_module(module)

    def before_lowering(self, component: Component, precision: str, **options) -> None:
        """Work the export job does in its own process before `export` runs in a process forked for
        it (`edgex.export._lower_apart`), for what the job reads again after the lowering: what the
        lowering's process makes ends with it. Default: nothing."""

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

    def scheme_reference(self, component: Component, precision: str, files: list[Path], **options) -> "Reference | None":
        """The reference an artifact's lowering is gated against (`edgex.parity.scheme`): by default
        the eager model with what `stored_scheme` reads back swapped in. A format overrides it where
        its scheme's numbers come from elsewhere (QNN: the QDQ graph the binary was compiled from,
        read as data and applied in eager PyTorch, never run). None for fp32."""
        from ..parity.scheme import build

        scheme = self.stored_scheme(component, precision, files, **options)
        return None if scheme is None else build(component, scheme)

    def stored_tensors(self, component: Component, files: list[Path], precision: str, **options) -> dict[str, StoredTensor] | None:
        """Tensors the written files store that no parity run reads whole, read back from them:
        export and `edgex verify` both score them (`edgex.parity.tensors`). By default the
        component's gather tables (`Component.tables`), found among `stored_constants`. Formats
        override it where more is unread (a GGUF's token embedding table, when the graph is fed
        embeddings; a sidecar nothing here runs, such as QNN's `.dlc`). `files` are one manifest
        entry's (an artifact's or a sidecar's); `options` those it was exported with. None: the
        parity run covers the files' weights."""
        from ..parity.tensors import tables_read_back

        if not component.tables:
            return None
        tables = {name: t.detach().float().numpy() for name, t in component.tables.items()}
        return tables_read_back(tables, self.stored_constants(component, files, precision, **options), self.unreadable)

    unreadable = "this format's stored constants cannot be read back here"

    def stored_quantized(self, component: Component, files: list[Path], precision: str, **options) -> "dict | str | None":
        """Every quantized tensor the files store, dequantized from them, beside the eager weight it
        was made from (`edgex.parity.quantized.QuantizedTensor` by the file's name for it): export
        and `edgex verify` score each against an independent quantization of that weight. None for
        files that store no quantized weight; a string where the format's quantized weights cannot
        be read here (why), which leaves the entry unverified. Default: None."""
        return None

    def stored_constants(self, component: Component, files: list[Path], precision: str, **options) -> dict[str, np.ndarray] | None:
        """Every constant tensor the files store as data a graph op reads (a gather's table), by
        the file's own name, decoded to float32 as the runtime sees it (dequantized where stored
        quantized). Weights packed inside a compiled kernel (an XNNPACK or MNN convolution, the HTP
        binary) are not listed: the parity runs read them whole. A format may list only the
        constants that can be one of the component's tables (`edgex.parity.tensors.may_hold_table`)
        and leave the rest of the file unread. `options`: those the artifact was exported with.
        None: the format cannot be read back here (`unreadable` says why)."""
        return None


def warm_up_module():
    """A one-layer module and its input: what an exporter's `warm_up` lowers once."""
    import torch

    return torch.nn.Linear(8, 8).eval(), (torch.zeros(1, 8),)


def float_dtype(precision: str) -> torch.dtype:
    import torch

    return torch.float16 if precision == "fp16" else torch.float32


def cast_inputs(inputs, dtype: torch.dtype) -> tuple:
    """The example inputs in `dtype` (floating ones) and in contiguous memory.

    A runner hands a graph dense row-major buffers, and so do edgex's runtimes. ExecuTorch records
    each input's memory layout from the example it is exported with (the tensor's dim order): an
    example that is a transposed view (a log-mel spectrogram [1, frames, mels] made as
    [1, mels, frames] and transposed) gives a program that accepts only that layout, and whose
    `execute` fails on a contiguous input with error 0x10 (ExecuTorch's NotSupported). Exported
    from a contiguous example, every format takes the buffers a runner has."""
    return tuple((t.to(dtype) if t.is_floating_point() else t).contiguous() for t in inputs)


@contextmanager
def module_in(component: Component, dtype: torch.dtype):
    """The component's own module with its float parameters and buffers in `dtype` for the
    duration, restored after: not a deep copy. A copy of the 0.6b talker graph duplicated the whole
    talker (its text embedding too, which no talker graph reads), 3 GB of an export's peak memory;
    in fp32 nothing is copied at all, in fp16 only the half-precision tensors are new.

    A buffer that is a view (`scale.reshape(shape)`, LeRobot's `pos_enc.unsqueeze(0)`) keeps its
    float32 base when its data is swapped, and torch.export refuses the mismatch (`float32 !=
    float16`): such buffers are replaced by a cast copy in their module and put back after.

    Of the parameters, only those the module's fp32 forward reads on the example are cast
    (`Component.module_reads`, the inputs torch.export traces): a talker graph's wrapper also holds
    the text embedding and the code predictor, which it never reads. Every buffer is cast: a graph
    may read other constants in another dtype (fp16 RMSNorm reads its ones column, fp32 its mean
    column), except those a module lists in `FP32_BUFFERS`, such as RoPE frequencies, whose fp16
    rounding grows with the position (`nn.transformer.register_rope`). A parameter read only in
    `dtype` would stay fp32 and fail the export or its runtime."""
    import torch

    from ..nn.transformer import FP32_BUFFERS

    module = component.module
    read = None if dtype == torch.float32 else component.module_reads()  # fp32: nothing to cast in practice
    buffers = [(owner, name, t) for owner in module.modules() for name, t in owner._buffers.items()
               if t is not None and t.is_floating_point() and name not in getattr(owner, FP32_BUFFERS, ())]
    views = [(owner, name, t) for owner, name, t in buffers if t.dtype != dtype and t._base is not None]
    params = [p for p in module.parameters() if read is None or id(p) in read]
    tensors = list({id(t): t for t in (*params, *(t for _, _, t in buffers)) if t.is_floating_point()}.values())
    replaced = {id(t) for _, _, t in views}
    saved = [(t, t.data) for t in tensors if t.dtype != dtype and id(t) not in replaced]
    try:
        for t, data in saved:
            t.data = data.to(dtype)
        for owner, name, t in views:
            owner._buffers[name] = t.detach().to(dtype).clone()
        yield module.eval()
    finally:
        for t, data in saved:
            t.data = data
        for owner, name, t in views:
            owner._buffers[name] = t
