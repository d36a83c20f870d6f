"""libmtmd (llama.cpp's multimodal library) running a speech model's generation graphs from an
mmproj GGUF, through `llama_cpp.mtmd_cpp` on the installed library: the part of the llama.cpp
runtime adapter (`llamacpp.py`) for files whose `general.type` is `mmproj`.

libmtmd exposes one call, `mtmd_gen_audio_process`:
  * GEN_CODE: the talker's hidden state and code 0 -> 16 codes and the sum of their embeddings.
    It samples inside its graph (top-k, top-p, its own random draw; `top_k = 1` is greedy), so
    only greedy samples can be fed: a sample drawn with noise is not run (`cannot_run`). The
    logits of the 15 heads are not an output; they are read from the graph while it runs, through
    the scheduler's evaluation callback (`mtmd_context_params.cb_eval`), at the head matmuls (a
    MUL_MAT whose weight is a view of `a.gen.code.head.weight`).
  * GEN_WAV: at most 72 frames of 16 codes a call -> PCM (1920 samples a frame, clamped to +-1),
    with an opaque state blob carried from call to call.
Everything libmtmd would abort on (ggml asserts, unknown tensors) is checked here first: the file's
keys and tensors when it loads, each input's length and code range before a call.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ...layouts import CODEC_EMBEDS, GEN_CODE0, GEN_CODES, GEN_HIDDEN, GEN_LOGITS, GEN_NOISE, GEN_WAV, GEN_WAV_CODES
from ...toolchain import native_output_silenced
from .base import Session

WAV_FRAMES_PER_CALL = 72  # clip.cpp's `wav_tfm_swa`: the frames one GEN_WAV call takes
SAMPLES_PER_FRAME = 1920
CODEBOOKS = 16
_HEAD = b"a.gen.code.head.weight"
_GGML_MAX_DIMS, _GGML_MAX_SRC, _GGML_MAX_OP_PARAMS, _GGML_MAX_NAME = 4, 10, 64, 64


class _GgmlTensor(ctypes.Structure):
    """`struct ggml_tensor` (ggml.h, llama-cpp-python 0.3.36): read-only, for the evaluation callback."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * _GGML_MAX_DIMS),
        ("nb", ctypes.c_size_t * _GGML_MAX_DIMS),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * (_GGML_MAX_OP_PARAMS // 4)),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * _GGML_MAX_SRC),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * _GGML_MAX_NAME),
        ("extra", ctypes.c_void_p),
        ("padding", ctypes.c_char * 8),
    ]


def _ggml():
    """libggml-base beside libmtmd: the op names and the tensor read the callback needs."""
    import llama_cpp

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_op_name.restype, lib.ggml_op_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    lib.ggml_nbytes.restype, lib.ggml_nbytes.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    return lib


def check_mmproj(path: Path) -> dict:
    """What the file says, after checking what libmtmd needs to load and run it (a missing key or
    tensor would be a native abort there): a Qwen3-TTS generation projector with its speaker
    encoder. Raises RuntimeError with the reason."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    fields = reader.fields

    def get(key):
        return fields[key].contents() if key in fields else None
    if get("general.type") != "mmproj" or get("clip.gen.audio.projector_type") != "qwen3tts_gen":
        raise RuntimeError(f"{path.name} is not a Qwen3-TTS generation mmproj (clip.gen.audio.projector_type "
                           f"{get('clip.gen.audio.projector_type')!r})")
    names = {t.name: t for t in reader.tensors}
    if not get("clip.has_audio_encoder") or "mm.a.fc.weight" not in names:
        raise RuntimeError(f"{path.name} holds no speaker encoder: libmtmd loads an mmproj only with an input encoder")
    head, embd, first = (names.get(f"a.gen.code.{n}.weight") for n in ("head", "embd", "out_embd"))
    if head is None or embd is None or first is None:
        raise RuntimeError(f"{path.name} lacks the code predictor's stacked heads / tables")
    return {"width": int(get("clip.gen.audio.projection_dim")), "vocab": int(head.shape[1]), "groups": int(head.shape[2]),
            "codec_rows": int(first.shape[1])}


class MtmdGen:
    """One libmtmd context on an mmproj (no text model: the generation graphs need none)."""

    def __init__(self, path: Path, threads: int, read_logits: bool):
        self.facts = check_mmproj(path)
        import llama_cpp
        import llama_cpp.mtmd_cpp as mtmd

        self._mtmd = mtmd
        self._logits: list[np.ndarray] = []
        self._callback = None
        with native_output_silenced():
            llama_cpp.llama_backend_init()
            params = mtmd.mtmd_context_params_default()
            params.use_gpu = False
            params.n_threads = threads
            params.warmup = False
            params.flash_attn_type = 0  # disabled: flash attention holds K/V in F16 on the CPU
            if read_logits:
                self._ggml = _ggml()
                self._callback = llama_cpp.ggml_backend_sched_eval_callback(self._observe)
                params.cb_eval = self._callback
            self._ctx = mtmd.mtmd_init_from_file(str(path).encode(), None, params)
        if not self._ctx:
            raise RuntimeError(f"libmtmd could not load {path.name}")
        info = mtmd.mtmd_gen_audio_get_info(self._ctx)
        if info.type != mtmd.MTMD_GEN_AUDIO_TYPE_QWEN3TTS:
            raise RuntimeError(f"libmtmd reports generation type {info.type} for {path.name}, not Qwen3-TTS")

    def close(self) -> None:
        if getattr(self, "_ctx", None):
            self._mtmd.mtmd_free(self._ctx)
            self._ctx = None

    __del__ = close

    def _observe(self, tensor: int, ask: bool, _user) -> bool:
        t = _GgmlTensor.from_address(tensor)
        if self._ggml.ggml_op_name(t.op) != b"MUL_MAT" or not t.src[0]:
            return False if ask else True
        weight = ctypes.cast(t.src[0], ctypes.POINTER(_GgmlTensor)).contents
        if not weight.name.startswith(_HEAD):
            return False if ask else True
        if ask:
            return True
        if t.type != 0:  # GGML_TYPE_F32; an exception cannot cross the callback: `gen_code` raises
            self._logits.append(None)
            return True
        values = np.empty(self._ggml.ggml_nbytes(tensor) // 4, np.float32)
        self._ggml.ggml_backend_tensor_get(tensor, values.ctypes.data, 0, values.nbytes)
        self._logits.append(values)
        return True

    def gen_code(self, hidden: np.ndarray, code0: int, top_k: int = 1, seed: int = 0):
        """(16 codes, the summed embedding [width], the 15 heads' logits [15, V] or None)."""
        mtmd = self._mtmd
        hidden = np.ascontiguousarray(np.asarray(hidden, np.float32).reshape(-1))
        if hidden.size != self.facts["width"]:
            raise RuntimeError(f"libmtmd's predictor takes a {self.facts['width']}-wide hidden state, got {hidden.size}")
        if not 0 <= int(code0) < self.facts["codec_rows"]:
            raise RuntimeError(f"code 0 {code0} is outside the talker's codec rows")
        inp = mtmd.mtmd_gen_inp_default(self._ctx)
        inp.type = mtmd.MTMD_GEN_PROCESS_TYPE_GEN_CODE
        inp.embd = hidden.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        inp.code0, inp.top_k, inp.top_p, inp.seed = int(code0), int(top_k), 1.0, int(seed)
        out = mtmd.mtmd_gen_out()
        self._logits = []
        with native_output_silenced():
            code = mtmd.mtmd_gen_audio_process(self._ctx, ctypes.byref(inp), ctypes.byref(out))
        if code != 0 or out.n_codes != CODEBOOKS:
            raise RuntimeError(f"libmtmd's GEN_CODE failed (code {code}, {out.n_codes} codes)")
        codes = np.ctypeslib.as_array(out.codes, (out.n_codes,)).astype(np.int64)
        embd = np.ctypeslib.as_array(out.embd, (self.facts["width"],)).copy()
        logits = None
        if self._callback is not None:
            if len(self._logits) != self.facts["groups"] or any(x is None for x in self._logits):
                raise RuntimeError(f"read {len(self._logits)} head outputs from libmtmd's graph, expected {self.facts['groups']}")
            logits = np.stack(self._logits)
        return codes, embd, logits

    def gen_wav(self, codes: np.ndarray, state: bytes | None) -> tuple[np.ndarray, bytes]:
        """Waveform of at most 72 frames of codes [16, T], and the state for the next call."""
        mtmd = self._mtmd
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] != CODEBOOKS or not 0 < codes.shape[1] <= WAV_FRAMES_PER_CALL:
            raise RuntimeError(f"libmtmd's Code2Wav takes [16, 1..{WAV_FRAMES_PER_CALL}] codes a call, got {codes.shape}")
        if codes.min() < 0 or codes.max() >= 2048:
            raise RuntimeError("Code2Wav codes must lie in 0..2047")
        flat = np.ascontiguousarray(codes.T.reshape(-1), np.int32)  # frame-major
        inp = mtmd.mtmd_gen_inp_default(self._ctx)
        inp.type = mtmd.MTMD_GEN_PROCESS_TYPE_GEN_WAV
        inp.codes, inp.n_codes = flat.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)), flat.size
        blob = ctypes.create_string_buffer(state, len(state)) if state else None
        inp.state_data = ctypes.cast(blob, ctypes.POINTER(ctypes.c_char)) if blob is not None else None
        inp.state_size = len(state) if state else 0
        out = mtmd.mtmd_gen_out()
        with native_output_silenced():
            code = mtmd.mtmd_gen_audio_process(self._ctx, ctypes.byref(inp), ctypes.byref(out))
        if code != 0:
            raise RuntimeError(f"libmtmd's GEN_WAV failed (code {code})")
        frames = codes.shape[1]
        if out.n_samples < frames * SAMPLES_PER_FRAME:
            raise RuntimeError(f"libmtmd returned {out.n_samples} samples for {frames} frames")
        wav = np.ctypeslib.as_array(out.audio, (out.n_samples,))[: frames * SAMPLES_PER_FRAME].copy()
        return wav, ctypes.string_at(out.state_data, out.state_size)

    def waveform(self, codes: np.ndarray) -> np.ndarray:
        """The whole waveform of codes [16, T], 72 frames a call with the state carried."""
        state, parts = None, []
        for start in range(0, codes.shape[1], WAV_FRAMES_PER_CALL):
            wav, state = self.gen_wav(codes[:, start: start + WAV_FRAMES_PER_CALL], state)
            parts.append(wav)
        return np.concatenate(parts)


class MmprojSession(Session):
    """A component fed to libmtmd as its GGUF's `edgex.feed.*` says: the predictor's frame
    (hidden, code 0, noise -> codes, logits, summed embedding) or Code2Wav (codes -> waveform)."""

    def __init__(self, path: Path, feed: dict, threads: int):
        self._feed = feed
        self._gen = MtmdGen(path, threads, read_logits=GEN_LOGITS in feed["outputs"])

    def close(self) -> None:
        self._gen.close()

    def cannot_run(self, inputs: Sequence[np.ndarray]) -> str | None:
        given = dict(zip(self._feed["inputs"], inputs))
        if GEN_NOISE in given and np.any(np.asarray(given[GEN_NOISE]) != 0):
            return ("libmtmd samples inside its graph from its own random draw (top_k = 1: greedy); a sample drawn with "
                    "the runner's noise cannot be fed to it")
        return None

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        given = dict(zip(self._feed["inputs"], inputs))
        why = self.cannot_run(inputs)
        if why:
            raise RuntimeError(why)
        results = {}
        if GEN_HIDDEN in given:
            codes, embd, logits = self._gen.gen_code(given[GEN_HIDDEN], int(np.asarray(given[GEN_CODE0]).reshape(-1)[0]))
            results[GEN_CODES] = codes[None, 1:]
            results[CODEC_EMBEDS] = embd[None, None]
            if logits is not None:
                results[GEN_LOGITS] = logits[None]
        if GEN_WAV_CODES in given:
            codes = np.asarray(given[GEN_WAV_CODES]).reshape(CODEBOOKS, -1)
            wav = self._gen.waveform(codes)
            new = self._feed["new_frames"]
            results[GEN_WAV] = (wav[(codes.shape[1] - new) * SAMPLES_PER_FRAME:] if new else wav)[None, None]
        return [results[name] for name in self._feed["outputs"]]
