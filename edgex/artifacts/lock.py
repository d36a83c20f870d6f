"""One writer per output folder: an fcntl lock file, so two builds never interleave their files.

The lock is `flock` on `<out>/.edgex-build.lock`: the kernel drops it when the holder exits, even
on SIGKILL, so a killed build never leaves a stale lock behind. The holder writes its pid and
start time into the file only to name itself in the refusal message.
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

from ..errors import EdgexError
from .files import ensure_writable_dir

LOCK_NAME = ".edgex-build.lock"


@contextmanager
def output_lock(out: Path) -> Iterator[Path]:
    """Hold the output folder's lock, or refuse at once with who holds it."""
    out = ensure_writable_dir(Path(out))
    path = out / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise EdgexError(f"cannot create the lock file {path}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown process"
            raise EdgexError(f"output folder {out} is in use by another edgex build ({holder}); "
                             "wait for it to finish or give another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}, started {datetime.now(timezone.utc).isoformat(timespec='seconds')}".encode(), 0)
        yield out
    finally:
        os.close(fd)  # releases the lock
