"""Peak resident memory of this process during a step (sampled; the kernel's max RSS only grows)."""

from __future__ import annotations

import threading

import psutil


class PeakRss:
    def __init__(self, interval: float = 0.05):
        self._interval = interval
        self._process = psutil.Process()
        self._stop = threading.Event()
        self.peak = 0

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            self._stop.wait(self._interval)

    def __enter__(self) -> "PeakRss":
        self.peak = self._process.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def mb(self) -> float:
        return round(self.peak / 2**20, 1)


def return_free_memory() -> None:
    """Give the heap's free pages back to the system (glibc `malloc_trim`): glibc keeps freed
    memory in its arenas, so a freed lowering or parity run could still count in the next job's
    peak. It does not stop one process growing from job to job on the 0.6b cpu export (8.0, 8.2,
    9.1, 10.9 GB after jobs 1-4), which is why jobs run in forked children (`edgex.isolation`).
    No-op without glibc."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):
        pass
