"""Optional toolchains: import lazily, and say what to install when one is missing."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from contextlib import contextmanager

from .errors import EdgexError

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
}


def require(module: str, purpose: str):
    """Import `module` or raise a one-line EdgexError naming the package to install."""
    try:
        return importlib.import_module(module)
    except ImportError:
        dist, hint = TOOLCHAINS.get(module, (module, f"pip install {module}"))
        raise EdgexError(f"{purpose} needs {dist}, which is not installed: {hint}") from None


@contextmanager
def stderr_silenced():
    """Silence native code writing straight to file descriptor 2 (not catchable from Python)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    return {dist: version(dist) for dist, _ in TOOLCHAINS.values()}
