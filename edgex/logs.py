"""Keep the toolchains' chatter out of edgex's output: a user sees edgex's own lines only.

Two kinds of noise: Python loggers and warnings (quieted by level), and native code writing straight
to file descriptors 1 and 2 (ExecuTorch's `[cpuinfo_utils.cpp:...]` lines on every `.pte` load,
llama.cpp's loader log, MNN's converter). Neither can be reached from Python's logging (and some
libraries print their native log through Python's sys.stderr), so while edgex works descriptors 1
and 2 point at /dev/null and edgex writes its own lines to a copy of the real stderr. `-v` keeps all of it visible; even then
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
from typing import Iterator, TextIO

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
def native_output_quiet() -> Iterator[TextIO]:
    """For the duration, whatever the toolchains write to fds 1 and 2 goes to /dev/null: native
    code, and Python code printing to sys.stdout / sys.stderr (ExecuTorch's pybindings print their
    C++ log through Python's sys.stderr). Yields a stream on the real stderr for edgex's own lines.
    With `-v` nothing is dropped and fd 1 goes to stderr, keeping stdout for `--json`. Worker
    processes started inside inherit the descriptors."""
    _flush_native()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    stream = io.TextIOWrapper(os.fdopen(os.dup(saved[2]), "wb", buffering=0), encoding="utf-8", errors="replace",
                              write_through=True)
    try:
        if verbose():
            os.dup2(saved[2], 1)
        else:
            with open(os.devnull, "w") as null:
                os.dup2(null.fileno(), 1)
                os.dup2(null.fileno(), 2)
        yield stream
    finally:
        _flush_native()  # what libraries left in Python's or C's buffers goes where it was headed
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        stream.close()
