"""llama.cpp runtime: libllama through llama-cpp-python's ctypes API, CPU.

A GGUF written by edgex says in its `edgex.feed.*` metadata what each component input and output
is to llama.cpp (`edgex.layouts.LlamaFeed`), so this adapter needs only the file:
  * token ids go in as a token batch, input embeddings as an embedding batch (M-RoPE models:
    `positions_per_embd` position streams per embedding, section-major, all equal to the token's
    position);
  * logits are llama.cpp's, from `logits_offset` on; hidden is its post-final-norm embedding output;
  * past K/V are written into llama.cpp's own KV cache, and the entries a call adds are read back,
    through the sequence-state blob (`llama_state_seq_set_data` / `get_data`). Its byte layout is
    llama.cpp's (`llama_kv_cache::state_write`, llama-cpp-python 0.3.36), written and parsed by
    `_KvState` below; a layout change fails loudly on the magic, sizes or types. A model with a
    sliding window (Spark-X2.5) has two caches: the full layers' past K/V seed the non-sliding
    one, the ring's last W - 1 positions the sliding one, and the sliding entries a call adds are
    written back into the ring at slot position % W.
The KV cache is llama.cpp's default F16, as a device would run it.
"""

from __future__ import annotations

import ctypes
import functools
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import EdgexError
from ...layouts import (
    EMBEDS, HIDDEN, KEY, LOGITS, NEXT_RING_KEY, NEXT_RING_VALUE, PAST_KEY, PAST_VALUE, POSITION, RING_KEY,
    RING_VALUE, TOKENS, VALUE,
)
from ...toolchain import ensure_installed, native_output_silenced, version
from . import RUNTIMES
from .base import Runtime, Session

_STATE_MAGIC = 0xAF143CD8  # llama-context.cpp io_magic
_TOKEN_NULL = -1
_F16, _F32 = 1, 0  # ggml_type
_NP = {_F16: np.float16, _F32: np.float32}
_CTX_ROUND = 256


def _read_gguf(path: Path) -> dict:
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields
    arch = fields["general.architecture"].contents()

    def get(key):
        return fields[key].contents() if key in fields else None
    feed = {"inputs": tuple(get("edgex.feed.inputs") or ()), "outputs": tuple(get("edgex.feed.outputs") or ()),
            "new_frames": int(get("edgex.feed.new_frames") or 0), "mmproj": get("general.type") == "mmproj"}
    if feed["mmproj"]:
        return feed
    return {
        **feed,
        "inputs": tuple(get("edgex.feed.inputs") or ()),
        "outputs": tuple(get("edgex.feed.outputs") or ()),
        "logits_offset": int(get("edgex.feed.logits_offset") or 0),
        "positions_per_embd": int(get("edgex.feed.positions_per_embd") or 1),
        "layers": int(get(f"{arch}.block_count")),
        "sliding": [bool(b) for b in get(f"{arch}.attention.sliding_window_pattern") or ()],
        "window": int(get(f"{arch}.attention.sliding_window") or 0),
        "kv_heads": int(get(f"{arch}.attention.head_count_kv")),
        "head_dim": int(get(f"{arch}.attention.key_length")),
    }


@dataclass
class _KvState:
    """One llama.cpp KV cache's cells for one sequence: positions and per-layer K/V rows.

    A model with a sliding window has two caches (llama_kv_cache_iswa): the non-sliding one, then
    the sliding-window one, each serialized as one of these parts after the blob's header."""

    positions: np.ndarray  # [cells] int
    key: np.ndarray  # [layers, cells, kv_heads * head_dim], in the cache's dtype (F16 / F32)
    value: np.ndarray

    def to_bytes(self, v_trans: bool, ext: bool) -> bytes:
        cells = len(self.positions)
        out = [struct.pack("<II", 1, cells)]  # n_stream, cells
        if not cells:
            return out[0]
        # per cell: pos, n_seq_id (1), [ext {x, y, tok}], the seq id (0)
        fields = [("pos", "<i4"), ("n_seq", "<u4")] + ([("x", "<i4"), ("y", "<i4"), ("tok", "<i4")] if ext else []) + [("seq", "<i4")]
        meta = np.zeros(cells, np.dtype(fields))
        meta["pos"], meta["n_seq"] = self.positions, 1
        if ext:
            meta["x"] = meta["y"] = self.positions
            meta["tok"] = _TOKEN_NULL
        out.append(meta.tobytes())
        layers, _, width = self.key.shape
        out.append(struct.pack("<II", int(v_trans), layers))
        keys = self.key.astype(np.float16)
        for k in keys:
            out += [struct.pack("<iQ", _F16, width * 2), k.tobytes()]
        values = np.ascontiguousarray(self.value.transpose(0, 2, 1) if v_trans else self.value, np.float16)
        for v in values:
            out += [struct.pack("<iII", _F16, 2, width) if v_trans else struct.pack("<iQ", _F16, width * 2), v.tobytes()]
        return b"".join(out)

    @classmethod
    def parse(cls, blob: bytes, off: int, ext: bool) -> tuple[_KvState, int]:
        """The part at `off`, and the offset after it."""
        def take(fmt):
            nonlocal off
            values = struct.unpack_from(fmt, blob, off)
            off += struct.calcsize(fmt)
            return values

        streams, cells = take("<II")
        if streams != 1:
            raise RuntimeError(f"unexpected llama.cpp sequence state ({streams} streams)")
        if not cells:
            empty = np.zeros((0, 0, 0), np.float32)
            return cls(np.zeros(0, np.int64), empty, empty), off
        positions = []
        for _ in range(cells):
            pos, n_seq = take("<iI")
            if ext:
                take("<iii")
            take(f"<{n_seq}i")
            positions.append(pos)
        v_trans, layers = take("<II")

        def table():
            nonlocal off
            ktype, row_bytes = take("<iQ")
            if ktype not in _NP:
                raise RuntimeError(f"llama.cpp cache type {ktype} is not F16/F32")
            data = np.frombuffer(blob, _NP[ktype], cells * row_bytes // np.dtype(_NP[ktype]).itemsize, off)
            off += cells * row_bytes
            return data.reshape(cells, -1)

        keys = [table() for _ in range(layers)]
        values = []
        for _ in range(layers):
            if not v_trans:
                values.append(table())
                continue
            vtype, el, width = take("<iII")
            if vtype not in _NP:
                raise RuntimeError(f"llama.cpp value cache type {vtype} is not F16/F32")
            data = np.frombuffer(blob, _NP[vtype], width * cells, off)
            off += width * cells * el
            values.append(data.reshape(width, cells).T)
        return cls(np.array(positions), np.stack(keys), np.stack(values)), off


def _state_bytes(parts: list[_KvState], ext: bool) -> bytes:
    header = struct.pack("<Ii", _STATE_MAGIC, 0)  # magic, seq id
    return header + b"".join(p.to_bytes(v_trans=True, ext=ext) for p in parts)


def _parse_state(blob: bytes, parts: int, ext: bool) -> list[_KvState]:
    magic, _seq = struct.unpack_from("<Ii", blob, 0)
    if magic != _STATE_MAGIC:
        raise RuntimeError(f"unexpected llama.cpp sequence state (magic {magic:#x})")
    off, states = 8, []
    for _ in range(parts):
        state, off = _KvState.parse(blob, off, ext)
        states.append(state)
    if off != len(blob):
        raise RuntimeError(f"llama.cpp sequence state: parsed {off} of {len(blob)} bytes")
    return states


def _cache_rows(t: np.ndarray, slots) -> np.ndarray:
    """[L, 1, KV, S, D] at `slots` -> llama.cpp's cache rows [L, len(slots), KV * D]."""
    picked = t[:, 0][:, :, slots]
    return picked.transpose(0, 2, 1, 3).reshape(t.shape[0], len(slots), -1)


class _Session(Session):
    def __init__(self, llama, model, feed: dict, threads: int):
        self._llama = llama
        self._model = model
        self._contexts: dict[tuple[int, int], object] = {}  # (n_ctx, n_batch) -> context, reused across calls
        self._feed = feed
        self._threads = threads
        self._n_vocab = llama.llama_vocab_n_tokens(llama.llama_model_get_vocab(model))
        self._n_embd = llama.llama_model_n_embd(model)

    def close(self) -> None:
        for ctx in self._contexts.values():
            self._llama.llama_free(ctx)
        self._contexts = {}
        if self._model is not None:
            self._llama.llama_model_free(self._model)
            self._model = None

    __del__ = close

    def _context(self, n_ctx: int, n_batch: int):
        """A context of this size with an empty cache. Contexts are kept, so repeated calls (the
        benchmark's timed runs) pay for the call, not for allocating caches and compute buffers."""
        ctx = self._contexts.get((n_ctx, n_batch))
        if ctx is not None:
            self._llama.llama_memory_clear(self._llama.llama_get_memory(ctx), True)
            return ctx
        llama = self._llama
        params = llama.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = self._threads
        params.embeddings = True
        params.pooling_type = llama.LLAMA_POOLING_TYPE_NONE
        params.flash_attn_type = llama.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.type_k = params.type_v = _F16
        ctx = llama.llama_init_from_model(self._model, params)
        if not ctx:
            raise RuntimeError("llama.cpp could not create a context for this GGUF")
        self._contexts[(n_ctx, n_batch)] = ctx
        return ctx

    @property
    def _ext(self) -> bool:
        return self._feed["positions_per_embd"] > 1  # M-RoPE cells carry 2-D positions

    @property
    def _caches(self) -> int:
        return 2 if any(self._feed["sliding"]) else 1  # non-sliding cache, then the sliding one

    def _seed(self, ctx, given: dict, start: int) -> None:
        """Write the past inputs into llama.cpp's caches: the full layers' first `start` slots, and
        the window's last W - 1 positions before `start` from their ring slots."""
        if PAST_KEY not in given or (self._caches == 2 and RING_KEY not in given):
            raise RuntimeError(f"the GGUF's feed starts at position {start} but declares no past K/V to seed the cache")
        full = np.arange(start)
        parts = [_KvState(full, _cache_rows(given[PAST_KEY], full), _cache_rows(given[PAST_VALUE], full))]
        if self._caches == 2:
            window = self._feed["window"]
            recent = np.arange(max(0, start - window + 1), start)
            slots = recent % window
            parts.append(_KvState(recent, _cache_rows(given[RING_KEY], slots), _cache_rows(given[RING_VALUE], slots)))
        blob = _state_bytes(parts, self._ext)
        buf = ctypes.cast(ctypes.c_char_p(blob), ctypes.POINTER(ctypes.c_uint8))  # read-only use, no copy
        if self._llama.llama_state_seq_set_data(ctx, buf, len(blob), 0) != len(blob):
            raise RuntimeError("llama.cpp rejected the KV cache state written from the past key/value inputs")

    def _get_state(self, ctx) -> list[_KvState]:
        size = self._llama.llama_state_seq_get_size(ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        written = self._llama.llama_state_seq_get_data(ctx, buf, size, 0)
        return _parse_state(ctypes.string_at(buf, written), self._caches, self._ext)  # slicing would build a list of ints

    def _batch(self, given: dict) -> tuple[np.ndarray | None, np.ndarray | None, int]:
        """The call's token ids or embeddings (one of them is None), and its length."""
        if TOKENS in given:
            tokens = np.ascontiguousarray(np.asarray(given[TOKENS]).reshape(-1), np.int32)
            return tokens, None, len(tokens)
        embd = np.ascontiguousarray(np.asarray(given[EMBEDS], np.float32).reshape(-1, self._n_embd))
        return None, embd, embd.shape[0]

    def _decode(self, ctx, tokens: np.ndarray | None, embd: np.ndarray | None, n: int, start: int) -> None:
        """One llama_decode of the batch at `start`."""
        npos = self._feed["positions_per_embd"]
        pos = np.ascontiguousarray(np.tile(np.arange(start, start + n, dtype=np.int32), npos))
        seq = (ctypes.c_int32 * 1)(0)
        seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * n)(*([ctypes.cast(seq, ctypes.POINTER(ctypes.c_int32))] * n))
        n_seq = (ctypes.c_int32 * n)(*([1] * n))
        logits = (ctypes.c_int8 * n)(*([1] * n))
        batch = self._llama.llama_batch()
        batch.n_tokens = n
        if tokens is not None:
            batch.token = tokens.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        else:
            batch.embd = embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        batch.pos = pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        batch.n_seq_id = n_seq
        batch.seq_id = seq_ptrs
        batch.logits = logits
        code = self._llama.llama_decode(ctx, batch)
        if code != 0:
            raise RuntimeError(f"llama_decode failed with code {code}")

    def _new_entries(self, state: _KvState, start: int, layers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Positions >= start in a cache part, and their K/V as [layers, n, KV, D]."""
        new = np.nonzero(state.positions >= start)[0]
        shape = (layers, len(new), self._feed["kv_heads"], self._feed["head_dim"])
        key, value = (t[:, new].astype(np.float32).reshape(shape) for t in (state.key, state.value))
        return state.positions[new], key, value

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        feed = self._feed
        given = dict(zip(feed["inputs"], inputs))
        start = int(np.asarray(given[POSITION]).reshape(-1)[0]) if POSITION in given else 0
        tokens, embd, n = self._batch(given)
        n_ctx = -(-(start + n) // _CTX_ROUND) * _CTX_ROUND
        llama = self._llama
        wants_state = bool({KEY, VALUE, NEXT_RING_KEY, NEXT_RING_VALUE} & set(feed["outputs"]))
        with native_output_silenced():
            ctx = self._context(n_ctx, max(n, 1))
            clock = [time.perf_counter()]
            if start:
                self._seed(ctx, given, start)
            clock.append(time.perf_counter())
            self._decode(ctx, tokens, embd, n, start)
            clock.append(time.perf_counter())
            logits = np.stack([np.ctypeslib.as_array(llama.llama_get_logits_ith(ctx, i), (self._n_vocab,)).copy()
                               for i in range(n)])
            hidden = np.stack([np.ctypeslib.as_array(llama.llama_get_embeddings_ith(ctx, i), (self._n_embd,)).copy()
                               for i in range(n)])
            states = self._get_state(ctx) if wants_state else None
            clock.append(time.perf_counter())
        self.phases = {name: 1e3 * (b - a) for name, a, b in zip(("seed_cache", "llama_decode", "read_outputs"), clock, clock[1:])}
        results = {LOGITS: logits[None, :, feed["logits_offset"]:], HIDDEN: hidden[None]}
        if states is not None:
            sliding = sum(feed["sliding"])
            _, key, value = self._new_entries(states[0], start, feed["layers"] - sliding)
            results[KEY], results[VALUE] = key.transpose(0, 2, 1, 3)[:, None], value.transpose(0, 2, 1, 3)[:, None]
            if self._caches == 2 and RING_KEY in given:
                positions, key, value = self._new_entries(states[1], start, sliding)
                slots = positions % feed["window"]
                for out, ring, new in ((NEXT_RING_KEY, RING_KEY, key), (NEXT_RING_VALUE, RING_VALUE, value)):
                    updated = np.array(given[ring], np.float32, copy=True)
                    updated[:, 0][:, :, slots] = new.transpose(0, 2, 1, 3)
                    results[out] = updated
        return [results[name] for name in feed["outputs"]]


@RUNTIMES.register("llamacpp")
class LlamaCppRuntime(Runtime):
    name = "llamacpp"
    requires = ("llama_cpp", "gguf")

    def unavailable_reason(self) -> str | None:
        try:
            ensure_installed("llama_cpp", "running .gguf artifacts")
        except EdgexError as exc:
            return str(exc)
        return None

    def load(self, files: list[Path], threads: int | None = None) -> Session:
        ensure_installed("llama_cpp", "running .gguf artifacts")
        ensure_installed("gguf", "reading .gguf artifacts")
        feed = _read_gguf(files[0])
        if feed["mmproj"]:  # a projector file: libmtmd runs it
            from .mtmd import MmprojSession

            return MmprojSession(files[0], feed, threads or 2)
        with native_output_silenced():  # libllama logs its loader progress on stderr
            import llama_cpp as llama

            llama.llama_backend_init()
            params = llama.llama_model_default_params()
            # No extra CPU buffer types (AMX / repacked weights): on this AMX host llama.cpp 0.3.36's
            # AMX path segfaults in llama_decode on Q8_0 weights of the tiny preset's shapes.
            params.use_extra_bufts = False
            model = llama.llama_model_load_from_file(str(files[0]).encode(), params)
        if not model:
            raise RuntimeError(f"llama.cpp could not load {files[0].name}")
        return _Session(llama, model, feed, threads or 2)

    def smoke(self, workdir: Path) -> str:
        """Loads libllama and its CPU backend and calls into it. No model runs: a GGUF needs a
        model layout (edgex writes them per recipe), and parity runs real ones."""
        ensure_installed("llama_cpp", "running .gguf artifacts")
        with native_output_silenced():
            import llama_cpp as llama

            llama.llama_backend_init()
            info = llama.llama_print_system_info().decode(errors="replace")
        if "CPU" not in info:
            raise RuntimeError(f"libllama loaded but reports no CPU backend: {info.strip()!r}")
        return "loaded libllama and its CPU backend (no model run)"

    def build_variant(self) -> str | None:
        """The CPU backend's line of `llama_print_system_info` (the instruction sets the loaded
        backend was built for, e.g. `CPU : ... AVX512 = 1 | AMX_INT8 = 1 | ...`): set-up builds
        llama.cpp with `GGML_NATIVE`, so one wheel computes differently on another CPU kind."""
        return _cpu_backend()

    def version(self) -> str | None:
        return version("llama-cpp-python")


@functools.cache
def _cpu_backend() -> str | None:
    try:
        ensure_installed("llama_cpp", "running .gguf artifacts")
    except EdgexError:
        return None
    with native_output_silenced():
        import llama_cpp as llama

        llama.llama_backend_init()
        info = llama.llama_print_system_info().decode(errors="replace")
    lines = [part.strip() for part in info.split("\n") if part.strip().startswith("CPU")]
    return " ".join(lines) or info.strip()
