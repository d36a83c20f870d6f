"""Optional toolchains: import lazily, and say what to install when one is missing."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from contextlib import contextmanager

from .errors import EdgexError

_LLAMA_HINT = "pip install 'edgex[llama]' (gguf==0.19.0; llama-cpp-python==0.3.36 builds from source, scripts/setup caches the wheel)"

# import name -> (distribution name, install hint)
TOOLCHAINS = {
    "torch": ("torch", "pip install torch==2.13.0"),
    "transformers": ("transformers", "pip install transformers==4.57.3"),
    "qwen_tts": ("qwen-tts", "pip install --no-deps qwen-tts==0.1.1"),
    "executorch": ("executorch", "pip install executorch==1.5.1"),
    "torchao": ("torchao", "pip install executorch==1.5.1 (brings torchao)"),
    "onnx": ("onnx", "pip install onnx"),
    "onnxscript": ("onnxscript", "pip install onnxscript"),
    "onnxruntime": ("onnxruntime", "pip install onnxruntime"),
    "MNN": ("MNN", "pip install 'edgex[mnn]' (MNN==3.6.1)"),
    "onnxruntime_qnn": ("onnxruntime-qnn", "pip install 'edgex[qnn]' (onnxruntime-qnn==2.7.0)"),
    "qai_hub": ("qai-hub", "pip install 'edgex[hub]' (qai-hub==0.56.0)"),
    "gguf": ("gguf", _LLAMA_HINT),
    "llama_cpp": ("llama-cpp-python", _LLAMA_HINT),
    "coremltools": ("coremltools", "pip install 'edgex[coreml]' (coremltools==9.0)"),
}


def ensure_installed(module: str, purpose: str) -> None:
    """Raise a one-line EdgexError naming the package to install, without importing `module`
    (some toolchains print banners or are slow on import)."""
    if module in sys.modules:
        found = sys.modules[module] is not None  # None: import explicitly blocked
    else:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
    if not found:
        dist, hint = TOOLCHAINS.get(module, (module, f"pip install {module}"))
        raise EdgexError(f"{purpose} needs {dist}, which is not installed: {hint}")


def require(module: str, purpose: str):
    """Import `module` or raise a one-line EdgexError naming the package to install."""
    ensure_installed(module, purpose)
    return importlib.import_module(module)


@contextmanager
def native_output_silenced():
    """Silence native code printing straight to file descriptors 1 and 2 (a runtime's banner on
    stdout would corrupt `--json`). C stdio buffers are flushed before the descriptors come back.
    With `-v` (edgex.logs.verbose) stderr stays and stdout goes to stderr."""
    import ctypes

    from .logs import verbose

    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    try:
        if verbose():
            os.dup2(saved[2], 1)
        else:
            with open(os.devnull, "w") as null:
                for fd in saved:
                    os.dup2(null.fileno(), fd)
        yield
    finally:
        libc.fflush(None)
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    return {dist: version(dist) for dist, _ in TOOLCHAINS.values()}
