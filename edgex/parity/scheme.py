"""Scheme references: the unmodified eager model running an artifact's own quantization.

A quantized artifact differs from fp32 eager for two reasons: the numeric scheme (weights rounded
to int8 / int4 blocks, activations quantized) and the lowering (graph capture, rewrites, kernels).
A broken graph scores 0-6 dB, inside the range a noisy 4-bit scheme scores, so one end-to-end gate
cannot tell them apart. A scheme reference is the eager reference with the parameters the file
stores (dequantized) swapped in and the scheme's activation quantization applied on the inputs of
the quantized layers; then

    scheme error   = scheme reference vs fp32 eager   (a policy: is this scheme good enough here?)
    lowering error = artifact vs scheme reference     (tight: did the format compute what it stores?)

Each exporter reads its own file back (`Exporter.stored_scheme`) and returns `StoredWeight`s:
the float values it quantized (`original`, in the layout the file stores them) and what the file
holds (`stored`, dequantized to float32). Which reference parameter a stored tensor belongs to is
found here by content, row by row (a row is the last axis): the export wrapper shares its
parameter tensors with the eager modules, and derived tensors (a stack of heads, an embedding
with extra rows folded in, a transposed MatMul weight) consist of rows of those parameters. So no
format or model names are needed here, and rows that belong to no parameter (e.g. a table folded
through another layer) are reported as unmatched rather than guessed.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Protocol, Sequence

import numpy as np

import torch
from torch import nn

from ..component import Component
from .check import END_TO_END, SNR, ParityReport, check, deciding_gate, measure
from .metrics import in_row_blocks
from .gates import end_to_end_tie_db
from .runtimes.base import Session

DYNAMIC = "dynamic"  # per-token (per row of the last axis) asymmetric, scale from each call's values
STATIC = "static"  # per-tensor scale / zero point fixed at export (calibrated)
BLOCKWISE = "blockwise"  # symmetric per block of `block` values along the last axis, scale absmax / qmax, at run time


@dataclass(frozen=True)
class ActivationQuant:
    """Fake quantization of a layer's input: quantize to integers, dequantize back to float."""

    kind: str  # DYNAMIC | STATIC | BLOCKWISE
    bits: int = 8
    signed: bool = True
    scale: float | None = None  # STATIC only
    zero_point: int | None = None  # STATIC only
    block: int | None = None  # BLOCKWISE only

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        qmin, qmax = (-(2 ** (self.bits - 1)), 2 ** (self.bits - 1) - 1) if self.signed else (0, 2**self.bits - 1)
        xf = x.float()
        if self.kind == BLOCKWISE:  # codes round(x * qmax / absmax) in [-qmax, qmax], zero point 0
            blocks = xf.reshape(*xf.shape[:-1], -1, self.block)
            scale = blocks.abs().amax(dim=-1, keepdim=True) / qmax
            inverse = torch.where(scale > 0, 1 / scale, torch.zeros_like(scale))
            return (torch.round(blocks * inverse) * scale).reshape(xf.shape).to(x.dtype)
        if self.kind == STATIC:
            scale, zero = torch.tensor(self.scale), torch.tensor(float(self.zero_point))
        else:  # the range of each row, widened to include 0 so that 0 stays exact
            low = xf.amin(dim=-1, keepdim=True).clamp(max=0)
            high = xf.amax(dim=-1, keepdim=True).clamp(min=0)
            scale = ((high - low) / (qmax - qmin)).clamp(min=torch.finfo(torch.float32).eps)
            zero = (qmin - torch.round(low / scale)).clamp(qmin, qmax)
        q = torch.clamp(torch.round(xf / scale) + zero, qmin, qmax)
        return ((q - zero) * scale).to(x.dtype)

    def to_json(self) -> dict:
        out = {"kind": self.kind, "bits": self.bits, "signed": self.signed}
        if self.kind == BLOCKWISE:
            return out | {"block": self.block}
        return out | ({"scale": self.scale, "zero_point": self.zero_point} if self.kind == STATIC else {})


@dataclass
class StoredWeight:
    original: torch.Tensor  # the float values the exporter quantized, in the file's layout
    stored: torch.Tensor  # what the file holds, dequantized to float32, same shape


@dataclass
class StoredScheme:
    """What an artifact's numeric scheme is, as far as its file lets it be read.

    `source` says where the weights came from: read back from the file, or the exporter's scheme
    re-applied in PyTorch (when the format's weights cannot be read), in words for the manifest.
    `activations` maps a module name under `component.module` to the fake quantization of its input;
    a list gives one per call of the module, in call order (a layer an unrolled graph calls several times, each call with its
    own recorded scale). `failures`: checks the reference itself failed while it was made (the float
    graph a QDQ graph was made from, scored against eager), which fail the artifact."""

    source: str
    weights: dict[str, StoredWeight]
    activations: dict[str, ActivationQuant | list[ActivationQuant]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # what the reference does not model
    failures: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)  # for the manifest (e.g. the float graph's figures)


class Reference(Protocol):
    """What `measure_split` needs of a scheme reference: outputs for inputs (teacher-forced on
    given tokens), a label and a JSON description for the manifest."""

    label: str

    def __call__(self, inputs, forced_tokens: dict | None = None) -> tuple: ...

    def to_json(self) -> dict: ...


@dataclass
class SchemeReference:
    """A reference callable `(inputs, forced_tokens | None) -> outputs` plus what it covers."""

    component: Component
    scheme: StoredScheme
    swaps: list[tuple[nn.Parameter, torch.Tensor]]
    coverage: dict

    @property
    def label(self) -> str:
        return self.scheme.source

    def __call__(self, inputs, forced_tokens: dict | None = None):
        forced = self.component.forced_reference
        if forced_tokens and forced is None:
            raise ValueError(f"{self.component.name}: tokens {', '.join(forced_tokens)} cannot be forced (no forced_reference)")
        with torch.no_grad(), self.applied():  # never Component.eager: it caches the fp32 outputs
            if forced_tokens:
                return tuple(forced(inputs, forced_tokens))
            return tuple(self.component.reference(*inputs))

    @contextmanager
    def applied(self):
        """The stored weights and activation quantizers in place for the duration; restored after,
        whatever happens (the same tensors serve the fp32 reference and every other artifact)."""
        saved = [(p, p.data) for p, _ in self.swaps]
        modules = dict(self.component.module.named_modules(remove_duplicate=False))
        hooks = []
        try:
            for param, data in self.swaps:
                param.data = data
            for name, quant in self.scheme.activations.items():
                hooks.append(modules[name].register_forward_pre_hook(_input_hook(_per_call(quant))))
            yield
        finally:
            for hook in hooks:
                hook.remove()
            for param, data in saved:
                param.data = data

    def to_json(self) -> dict:
        out = {"source": self.scheme.source, "notes": self.scheme.notes, "coverage": self.coverage,
               "activations": {n: _quant_json(q) for n, q in sorted(self.scheme.activations.items())}}
        return out | self.scheme.details

    @property
    def failures(self) -> list[str]:
        return self.scheme.failures


def called_modules(component: Component, kind: type[nn.Module] = nn.Linear) -> set[str]:
    """Names of the `kind` modules the export wrapper actually calls: a graph may hold a module it
    reads another way (the predictor step's heads, stacked into one tensor), which a format then
    stores as a plain constant and a layer-wise quantizer never sees. Every alias is listed: a
    wrapper that holds a submodule under a second name (the decoders' `transformer`, also
    `decoder.pre_transformer`) calls it through that name, which is the one an exported graph
    records (an ONNX node's name scope)."""
    called, hooks = set(), []
    for name, module in component.module.named_modules(remove_duplicate=False):
        if isinstance(module, kind):
            hooks.append(module.register_forward_hook(lambda _m, _a, _o, name=name: called.add(name)))
    try:
        with torch.no_grad():
            component.module(*component.example_inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return called


def rounded_to_fp16(component: Component) -> StoredScheme:
    """fp16 as a scheme: every float parameter rounded to half, computed in fp32. A half-precision
    file stores exactly these weights; what the artifact adds (fp16 activations and accumulation,
    kernels) is its lowering. Eager PyTorch run in half would not be a better reference: its own
    fp16 arithmetic differs from every runtime's (measured on the tiny preset: 61-62 dB against
    ONNX Runtime fp16, no closer than fp32 eager), while the weight rounding is exact and is what
    dominates the conv decoder's fp16 error (Code2Wav: 53 dB from the weights, 60 dB lowering).
    Only the parameters the reference reads are rounded: the others cannot change its outputs, and
    a wrapper can hold far more (a Qwen3-TTS talker graph holds the talker's text embedding and code
    predictor, which it never reads)."""
    read = component.reference_reads()
    weights = {n: StoredWeight(p.detach(), p.detach().to(torch.float16).to(torch.float32))
               for n, p in component.module.named_parameters() if p.is_floating_point() and id(p) in read}
    return StoredScheme("weights rounded to fp16 in PyTorch", weights)


def _quant_json(quant) -> dict | list:
    return [q.to_json() for q in quant] if isinstance(quant, list) else quant.to_json()


def _per_call(quant):
    """A callable applying the quantizer of each call in turn (one quantizer: every call)."""
    if not isinstance(quant, list):
        return quant
    calls = iter(range(1 << 62))
    return lambda x: quant[next(calls) % len(quant)](x)


def _input_hook(quant):
    def hook(_module, args):
        return (quant(args[0]), *args[1:])

    return hook



def _rows(t: torch.Tensor) -> torch.Tensor:
    """`t` as float32 rows along its last axis: a view where it can be one (a transposed weight
    stays a strided view, not a copy of the table)."""
    t = t.detach().to(torch.float32)
    return t.reshape(1, -1) if t.ndim <= 1 else t.reshape(-1, t.shape[-1])


class _RowIndex:
    """Rows of several float32 tables, found again by content: each row's first occurrence (tables in
    order, rows in order) for the rows of another table. Rows are keyed by a 64-bit hash of their bits
    in one sorted array, and every hit is checked value for value, so a hash collision costs a lookup,
    never a wrong row. A dict keyed by each row's bytes held ~17 GB for a 263M-parameter 1-D U-Net,
    whose convolution kernels are rows of 5 values."""

    def __init__(self, tables: list[torch.Tensor]):
        self._tables = [t.numpy() for t in tables]
        hashes = [_row_hash(t) for t in self._tables]
        table = np.concatenate([np.full(len(h), i, np.int32) for i, h in enumerate(hashes)]) if hashes else np.zeros(0, np.int32)
        row = np.concatenate([np.arange(len(h), dtype=np.int64) for h in hashes]) if hashes else np.zeros(0, np.int64)
        flat = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
        order = np.argsort(flat, kind="stable")  # equal hashes keep insertion order: the first occurrence first
        self._hash, self._table, self._row = flat[order], table[order], row[order]

    def find(self, rows: torch.Tensor) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """{table: (indices into `rows`, the matching rows of that table)} for the rows found."""
        values = rows.numpy()
        wanted = _row_hash(values)
        at = np.minimum(np.searchsorted(self._hash, wanted), max(len(self._hash) - 1, 0))
        pending = np.flatnonzero(self._hash[at] == wanted) if len(self._hash) else np.zeros(0, np.int64)
        hits: dict[int, tuple[list, list]] = {}
        while pending.size:  # each round checks one candidate per row; a collision moves that row to the next
            tables, found = self._table[at[pending]], self._row[at[pending]]
            missed = []
            for table in np.unique(tables):
                mine = tables == table
                candidates = self._tables[table]
                rows_here, found_here = pending[mine], found[mine]
                same = (np.all(candidates[found_here].view(np.uint32) == values[rows_here].view(np.uint32), axis=1)
                        if candidates.shape[1] == values.shape[1] else np.zeros(len(rows_here), bool))
                hits.setdefault(int(table), ([], []))
                hits[int(table)][0].append(rows_here[same])
                hits[int(table)][1].append(found_here[same])
                missed.append(rows_here[~same])
            pending = np.concatenate(missed)
            at[pending] += 1
            pending = pending[(at[pending] < len(self._hash))]
            pending = pending[self._hash[at[pending]] == wanted[pending]]
        found_rows = {t: (np.concatenate(a), np.concatenate(r)) for t, (a, r) in hits.items()}
        return {t: (a[np.argsort(a)], r[np.argsort(a)]) for t, (a, r) in found_rows.items() if a.size}


def _row_hash(rows: np.ndarray) -> np.ndarray:
    """A 64-bit hash of each row's float32 bits and length (wrapping multiply-add with fixed odd
    multipliers); equal rows hash equal, as bytes-equal rows did. In blocks of rows
    (`metrics.in_row_blocks`), each made contiguous there: the uint64 copy of a 152k x 2048
    embedding at once is 2.5 GB, and a transposed table is read as the strided view it is."""
    width = rows.shape[1]
    multipliers = np.random.default_rng(width).integers(1, 1 << 62, width, dtype=np.uint64) * np.uint64(2) + np.uint64(1)

    def hashed(block: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return (np.ascontiguousarray(block).view(np.uint32).astype(np.uint64) * multipliers).sum(axis=1, dtype=np.uint64) + np.uint64(width)

    return in_row_blocks(hashed, rows, rows=8192)


def made_of_parameter_rows(module: nn.Module, tensors: dict[str, torch.Tensor]) -> set[str]:
    """The names in `tensors` whose every row (last axis; a 2-D tensor's columns too) is a row of one of
    `module`'s parameters: a table made from weights (a stack of embeddings), which a scheme
    reference can put quantized values in place of. A table computed otherwise (a RoPE table, a
    window, a codebook normalized from its sums) matches no parameter row as a whole."""
    params = [_rows(p) for p in module.parameters() if p.is_floating_point()]
    if not params or not tensors:
        return set()
    index = _RowIndex(params)
    made = set()
    for name, tensor in tensors.items():
        views = [tensor, tensor.t()] if tensor.ndim == 2 else [tensor]
        for view in views:
            rows = _rows(view)
            if sum(len(at) for at, _ in index.find(rows).values()) == len(rows):
                made.add(name)
                break
    return made


def _row_count(t: torch.Tensor) -> int:
    """How many rows `_rows` makes of `t`, without making them."""
    return 1 if t.ndim <= 1 else t.numel() // t.shape[-1]


def _dense_view(t: torch.Tensor, param: torch.Tensor) -> bool:
    """`t` reads every element of `param` exactly once, in any order: a reshape, a transpose or a
    permutation of it, made without a copy (same storage, same start, a dense stride pattern)."""
    if (t.untyped_storage().data_ptr() != param.untyped_storage().data_ptr() or t.dtype != param.dtype
            or t.numel() != param.numel() or t.storage_offset() != param.storage_offset() or not param.is_contiguous()):
        return False
    expected = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.size()) if sz > 1):
        if stride != expected:
            return False
        expected *= size
    return True


_SAMPLES = 16  # elements compared before two tensors are compared whole


def _sample_at(numel: int) -> torch.Tensor:
    return torch.linspace(0, numel - 1, min(_SAMPLES, numel)).long()


def _copied_parameter(original: torch.Tensor, params: dict[int, list[tuple[str, nn.Parameter]]]):
    """(name, parameter, transposed) for the one parameter whose values `original` holds in the same
    order, or transposed (a 2-D weight stored [in, out]); None where none does, or several do
    (tied copies: which one the file was made from is not told by its values)."""
    found = []
    for pname, param in params.get(original.numel(), []):
        at = _sample_at(param.numel())
        expected = param.detach().reshape(-1)[at].float()
        layouts = [False] + ([True] if param.ndim == 2 and original.ndim == 2 and original.shape == param.shape[::-1] else [])
        for transposed in layouts:
            if transposed:
                rows, cols = at // param.shape[1], at % param.shape[1]
                sample = original[cols, rows]
            else:
                sample = original.reshape(-1)[at]
            if torch.equal(sample.float(), expected):
                whole = original.t() if transposed else original.reshape(param.shape)
                if torch.equal(whole.float(), param.detach().float()):
                    found.append((pname, param, transposed))
                    break
    return found[0] if len(found) == 1 else None


def _viewed_parameters(component: Component, weights: dict[str, StoredWeight]) -> dict[str, tuple[str, nn.Parameter, Callable]]:
    """{stored name: (parameter name, parameter, layout)} for each stored weight that stands for one
    reference parameter as a whole: its own tensor or a view of it (fp16 rounding and torchao store
    the parameter itself; Core ML a kernel reshaped, a MatMul weight transposed), or a copy of its
    values in the same order or transposed (a file's weights read back). `layout(stored)` puts the
    stored values in the parameter's shape, element by element: matching such a weight by content, row by
    row, would index every row's bytes (several copies of a model's weights) and, where its rows are
    short (a 1x1 convolution's rows are single values), could take a row of another tensor that
    holds the same value."""
    params = dict(component.module.named_parameters())
    by_storage: dict[int, list[tuple[str, nn.Parameter]]] = {}
    by_size: dict[int, list[tuple[str, nn.Parameter]]] = {}
    for pname, param in params.items():
        by_storage.setdefault(param.untyped_storage().data_ptr(), []).append((pname, param))
        by_size.setdefault(param.numel(), []).append((pname, param))
    found = {}
    for name, weight in weights.items():
        original = weight.original
        same_name = [(name, params[name])] if name in params else []
        candidates = same_name + by_storage.get(original.untyped_storage().data_ptr(), [])
        viewed = next(((pname, p) for pname, p in candidates if _dense_view(original, p)), None)
        if viewed is not None:
            found[name] = (*viewed, partial(_through_view, viewed[1], original.size(), original.stride()))
            continue
        copied = _copied_parameter(original, by_size)
        if copied is not None:
            pname, param, transposed = copied
            found[name] = (pname, param, (lambda s: s.t()) if transposed else partial(torch.reshape, shape=param.shape))
    return found


def _through_view(param: torch.Tensor, size, stride, stored: torch.Tensor) -> torch.Tensor:
    """`stored`, laid out as a view (`size`, `stride`) of `param`, in `param`'s own shape."""
    new = torch.empty(param.shape, dtype=stored.dtype)
    new.as_strided(size, stride, 0).copy_(stored)
    return new


def build(component: Component, scheme: StoredScheme) -> SchemeReference:
    """Map every stored weight onto the reference parameter it was made from.

    A stored weight that stands for one parameter as a whole (its tensor, a view of it, or a copy of
    its values: `_viewed_parameters`) replaces it by position; every other stored row is found by
    content, on the reference parameter row with the same original values (a derived table: a stack
    of heads, an embedding with rows folded in)."""
    changed = {n: w for n, w in scheme.weights.items() if not torch.equal(w.original.float(), w.stored.float())}
    for name, weight in changed.items():
        if tuple(weight.original.shape) != tuple(weight.stored.shape):
            raise ValueError(f"stored weight {name}: shape {tuple(weight.stored.shape)} != original {tuple(weight.original.shape)}")
    swaps, params = [], {}
    direct = _viewed_parameters(component, changed)
    for name, (pname, param, layout) in direct.items():
        if pname not in params:
            swaps.append((param, layout(changed[name].stored).contiguous().to(param.dtype)))
            params[pname] = f"{_row_count(param)}/{_row_count(param)} rows"
    searched = {n: w for n, w in changed.items() if n not in direct}
    coverage = {"stored_tensors": len(scheme.weights), "quantized_tensors": len(changed), "parameters_swapped": params,
                "unmatched": {}}
    # the stored weights live on in `swaps` only: the read-back copies go (0.9 GB at the 0.6b talker's fp16)
    reference = SchemeReference(component, replace(scheme, weights={}), swaps, coverage)
    if searched:
        _search_rows(component, searched, direct_params={id(p) for _, p, _ in direct.values()}, swaps=swaps, coverage=coverage)
    return reference


def _search_rows(component: Component, changed: dict[str, StoredWeight], direct_params: set[int], swaps: list,
                 coverage: dict) -> None:
    """Each row of `changed` onto the first reference parameter row with the same original values,
    skipping the parameters already mapped by position; rows matching none are reported unmatched."""
    layouts: list[tuple[str, bool]] = []  # (stored name, transposed), in the order a row's first match is taken
    original_rows: list[torch.Tensor] = []
    stored_rows: dict[tuple[str, bool], torch.Tensor] = {}
    for name, weight in changed.items():
        views = [(False, weight.original, weight.stored)]
        if weight.original.ndim == 2:  # a MatMul weight may be stored [in, out]
            views.append((True, weight.original.t(), weight.stored.t()))
        for transposed, original, stored in views:
            layouts.append((name, transposed))
            original_rows.append(_rows(original))
            stored_rows[name, transposed] = _rows(stored)
    index = _RowIndex(original_rows)
    used: dict[tuple[str, bool], set[int]] = {key: set() for key in stored_rows}
    params = coverage["parameters_swapped"]
    for pname, param in component.module.named_parameters():
        if id(param) in direct_params:
            continue
        rows = _rows(param)
        hits = index.find(rows)
        if not hits:
            continue
        new = rows.clone()
        for layout, (at, found) in hits.items():
            key = layouts[layout]
            new[torch.from_numpy(at)] = stored_rows[key][torch.from_numpy(found)]
            used[key].update(found.tolist())
        swaps.append((param, new.reshape(param.shape).to(param.dtype)))
        params[pname] = f"{sum(len(at) for at, _ in hits.values())}/{len(rows)} rows"
    for name in changed:
        found, total = max((len(used[key]), len(stored_rows[key])) for key in stored_rows if key[0] == name)
        if found < total:
            coverage["unmatched"][name] = f"{total - found} of {total} rows match no reference parameter"


class Recording(Session):
    """An artifact's session whose outputs are kept, call by call, so that every later scoring
    pass replays them and the runtime can be released first (`release`): a runtime's loaded graph
    (an fp16 ONNX talker's weights, cast to fp32 by ONNX Runtime) need not be held beside the
    scheme reference's weights built after it. A scoring pass feeds the artifact the same inputs
    in the same order however it is gated, which is what makes a replay the artifact's outputs."""

    def __init__(self, session: Session):
        self._session, self._outputs, self._not_run = session, [], {}

    def cannot_run(self, inputs: Sequence[np.ndarray]) -> str | None:
        """The artifact's answer, kept per input values so that a replay answers the same."""
        key = _values_key(inputs)
        if key not in self._not_run:
            self._not_run[key] = self._session.cannot_run(inputs) if self._session is not None else None
        return self._not_run[key]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self._session is None:
            raise RuntimeError("the artifact's runtime was released before this call was recorded")
        self._outputs.append(self._session.run(inputs))
        return self._outputs[-1]

    def release(self) -> None:
        self._session = None

    def replay(self) -> Session:
        """A session that returns the recorded outputs in order, one per call."""
        outputs, not_run = list(self._outputs), dict(self._not_run)

        class _Replay(Session):
            def cannot_run(self, inputs: Sequence[np.ndarray]) -> str | None:
                return not_run.get(_values_key(inputs))

            def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
                if not outputs:
                    raise RuntimeError("a replay asked for more calls than the artifact's recorded run made")
                return outputs.pop(0)

        return _Replay()


def _values_key(arrays: Sequence[np.ndarray]) -> str:
    import hashlib

    digest = hashlib.sha1()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class Remembered:
    """A scheme reference whose free-running outputs are kept per sample: the lowering pass and the
    scheme pass (and a re-gate) each need them for the same samples, and on a decoder window or a
    talker chunk one run of the eager model is most of a job's parity time. Teacher-forced calls
    are never kept (their tokens are the artifact's)."""

    def __init__(self, reference: Reference):
        self._reference = reference
        self._kept: dict[int, tuple] = {}  # id(sample inputs) -> (those inputs, outputs)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._reference, name)

    def __call__(self, inputs, forced_tokens: dict | None = None):
        if forced_tokens:
            return self._reference(inputs, forced_tokens)
        kept = self._kept.get(id(inputs))
        if kept is None or kept[0] is not inputs:
            kept = self._kept[id(inputs)] = (inputs, self._reference(inputs, None))
        return kept[1]

    def kept_for(self, arrays: Sequence[np.ndarray]) -> tuple | None:
        """The kept outputs of the sample whose inputs, as a session is fed them, are `arrays`."""
        for inputs, outputs in self._kept.values():
            if len(inputs) == len(arrays) and all(_same_values(t, a) for t, a in zip(inputs, arrays)):
                return outputs
        return None


def remembered(reference: Reference) -> Remembered:
    return reference if isinstance(reference, Remembered) else Remembered(reference)


def _same_values(tensor: torch.Tensor, array: np.ndarray) -> bool:
    array = np.asarray(array)
    if tuple(tensor.shape) != array.shape:
        return False
    return np.array_equal(tensor.detach().cpu().numpy().astype(array.dtype, copy=False), array)


class _Eager(Session):
    """The scheme reference scored as if it were an artifact (its figure against fp32 eager): the
    outputs it gave the lowering pass on the same inputs, or a run where it kept none."""

    def __init__(self, reference: Remembered):
        self._reference = reference

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        outputs = self._reference.kept_for(inputs)
        if outputs is None:
            outputs = self._reference(tuple(torch.from_numpy(np.asarray(x)) for x in inputs))
        return [t.detach().cpu().numpy() for t in outputs]


_FIGURES = ("threshold_db", "min_snr_db", "min_waveform_snr_db", "min_waveform_correlation", "min_token_agreement",
            "min_top1_agreement", "max_action_error", "samples", "divergences", "failures", "verdict", "gate")


REFERENCE_CHECK = "fp32 graph"  # the figure a scheme reference's own check failed on


def _reference_check(reference: Reference) -> dict:
    """A failed check of the scheme reference itself, as a deciding check: the fp32 graph a QDQ
    graph was quantized from, run against eager (`details["float_graph"]`, with the check that
    decided it where recorded); without figures it decides as a failure without a margin."""
    graph = reference.to_json().get("float_graph") or {}
    snr, limit = graph.get("min_snr_db"), graph.get("threshold_db", math.nan)
    return {**(graph.get("gate") or check(REFERENCE_CHECK, SNR, snr, limit, snr, limit)), "figure": REFERENCE_CHECK}


def measure_split(component: Component, session: Session, runtime: str, float_dtype: str, scheme_db: float,
                  lowering_db: float, reference: Reference, method: str = "runtime",
                  simulator: str | None = None, accepted: str | None = None) -> ParityReport:
    """Three figures on the same samples, the artifact run once, each gated:

    - the report itself: artifact vs fp32 eager, gated at `scheme_db`, the precision's gate (what
      a user of the artifact gets: scheme and lowering errors add up, and each passing its own
      gate does not make their sum pass); its flips at `gates.end_to_end_tie_db`, two errors' tie;
    - `scheme`: the scheme reference vs fp32 eager, gated at `scheme_db` too (a policy: is this
      quantization good enough for this component);
    - `lowering`: artifact vs the scheme reference, gated at `lowering_db` (near rounding).

    The verdict passes only if all three pass: a broken lowering fails however noisy the scheme is,
    a scheme too noisy for the component fails however faithful its lowering, and an artifact under
    the precision's gate fails whichever of the two put it there. `gate` names the one that decided.

    `accepted`: why the recipe declares this scheme too coarse for the component, when the user
    asked for it by name (`RecipeFacts.coarse`). Its scheme and end-to-end failures are then
    `waived` (kept on the report, not deciding): the lowering gate alone, which a broken graph
    fails however coarse the scheme, decides, and a NaN / inf still fails."""
    reference = remembered(reference)
    recorded = Recording(session)
    report = measure(component, recorded, runtime, float_dtype, scheme_db, method, simulator,
                     tie_level_db=end_to_end_tie_db(scheme_db))
    lowering = measure(component, recorded.replay(), runtime, float_dtype, lowering_db, method, simulator,
                       reference=reference)
    scheme = measure(component, _Eager(reference), "eager", "float32", scheme_db, "eager")
    scheme.gate["figure"], lowering.gate["figure"] = "scheme", "lowering"
    report.scheme = {"reference": reference.label, **reference.to_json(),
                     **{k: getattr(scheme, k) for k in _FIGURES}}
    report.lowering = {"reference": f"scheme reference ({reference.label})", **{k: getattr(lowering, k) for k in _FIGURES}}
    end_to_end = report.failures
    policy = [f"{END_TO_END}: {f}" for f in end_to_end] + [f"scheme: {f}" for f in scheme.failures]
    report.failures = policy + [f"lowering: {f}" for f in lowering.failures]
    figures = {END_TO_END: (report.gate, bool(end_to_end)), "scheme": (scheme.gate, bool(scheme.failures)),
               "lowering": (lowering.gate, bool(lowering.failures))}
    if accepted:
        kept = {f"{END_TO_END}: {f}" for f in report.nonfinite} | {f"scheme: {f}" for f in scheme.nonfinite}
        report.waived = [f for f in policy if f not in kept]
        report.failures = [f for f in report.failures if f not in report.waived]
        figures = {"lowering": figures["lowering"]}
    reference_failures = getattr(reference, "failures", [])
    report.failures += [f"reference: {f}" for f in reference_failures]
    if reference_failures:
        figures[REFERENCE_CHECK] = (_reference_check(reference), True)
    report.verdict = "fail" if report.failures else "pass"
    report.gate = deciding_gate(figures)
    report.seconds += scheme.seconds
    return report
