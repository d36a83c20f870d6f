"""One whole-graph compile at a time among an export's jobs.

Some lowerings are one native call that holds several times the component's weights while it
compiles the whole graph (QNN's HTP context build: 5-6 GB for the 0.6b Qwen3-TTS talker and for its
unrolled code predictor). Jobs run side by side in forked children (`edgex.side_by_side`), which
budget each other by what a finished job added; two such compiles at once outgrow a machine that
holds either alone. An exporter that declares `lowering_alone` takes a turn for its lowering: an
exclusive `flock` on a file the export's process makes before its jobs fork. Only the compile waits;
the job's parity run goes on beside the next job's compile. The kernel releases a turn when its
process ends, however it ends (a job killed mid-compile does not hold up the others).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator

_PATH: str | None = None  # set in the export's process; forked jobs inherit it


@contextmanager
def turns() -> Iterator[None]:
    """Around an export's jobs, in the process that forks them: the file their turns are taken on
    (nested calls share the outer one's)."""
    global _PATH
    if _PATH is not None:
        yield
        return
    fd, path = tempfile.mkstemp(prefix="edgex-lowering-", suffix=".lock")
    os.close(fd)
    _PATH = path
    try:
        yield
    finally:
        _PATH = None
        try:
            os.unlink(path)
        except OSError:
            pass


@contextmanager
def turn(needed: bool) -> Iterator[list[float]]:
    """Hold the export's turn while the body runs, where `needed` and an export set turns up;
    yields a one-item list holding the seconds spent waiting for it."""
    waited = [0.0]
    if not needed or _PATH is None:
        yield waited
        return
    start = time.perf_counter()
    fd = os.open(_PATH, os.O_RDWR)  # an open file of its own: flock excludes other opens, not this one's copies
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        waited[0] = time.perf_counter() - start
        yield waited
    finally:
        os.close(fd)
