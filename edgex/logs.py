"""Keep the toolchains' chatter out of edgex's output: a user sees edgex's own lines only.

Two kinds of noise: Python loggers and warnings (quieted by level), and native code writing straight
to file descriptors 1 and 2 (ExecuTorch's `[cpuinfo_utils.cpp:...]` lines on every `.pte` load,
llama.cpp's loader log, MNN's converter). The second cannot be reached from Python's logging, so
while edgex works the descriptors point at /dev/null and Python's `sys.stdout` / `sys.stderr` (and
rich, which writes through them) at copies of the real ones. `-v` keeps all of it visible; even then
native stdout goes to stderr, so `--json` on stdout stays parseable.

The setting travels to spawned worker processes through the environment.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import warnings
from contextlib import contextmanager
from typing import Iterator

VERBOSE_ENV = "EDGEX_VERBOSE"


def set_verbose(verbose: bool) -> None:
    if verbose:
        os.environ[VERBOSE_ENV] = "1"
    else:
        os.environ.pop(VERBOSE_ENV, None)


def verbose() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def quiet_libraries() -> None:
    if verbose():
        return
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch  # noqa: F401  (torch configures its loggers on import; quiet them afterwards)

    for name in ("torch", "torch.utils._pytree", "torchao", "transformers", "onnxscript", "executorch", "torch.onnx"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _flush_native() -> None:
    import ctypes

    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # C stdio buffers, before a descriptor changes under them


@contextmanager
def native_output_quiet() -> Iterator[None]:
    """For the duration, native writes to fds 1/2 go to /dev/null (with `-v`: fd 1 goes to stderr),
    while Python's sys.stdout/sys.stderr keep writing to the real stdout/stderr. Worker processes
    started inside inherit the quiet descriptors."""
    _flush_native()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    streams = (sys.stdout, sys.stderr)
    sys.stdout = io.TextIOWrapper(os.fdopen(os.dup(saved[1]), "wb", buffering=0), write_through=True,
                                  encoding=getattr(streams[0], "encoding", None) or "utf-8", errors="replace")
    sys.stderr = io.TextIOWrapper(os.fdopen(os.dup(saved[2]), "wb", buffering=0), write_through=True,
                                  encoding=getattr(streams[1], "encoding", None) or "utf-8", errors="replace")
    try:
        if verbose():
            os.dup2(saved[2], 1)
        else:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                os.dup2(null.fileno(), 2)
        yield
    finally:
        _flush_native()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        replaced = (sys.stdout, sys.stderr)
        sys.stdout, sys.stderr = streams
        for stream in replaced:
            stream.close()
