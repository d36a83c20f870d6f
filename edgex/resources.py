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


class JobMemory:
    """A job's memory, in the process it runs in and the one its lowering ran in: the peak resident
    set (a forked child's starts at the pages it shares with its parent) and what the job added to
    the resident set it started with, the figure jobs side by side are budgeted by."""

    def __init__(self):
        self.start = psutil.Process().memory_info().rss

    def record(self, lowering_peak_mb: float | None = None) -> dict:
        """`lowering_peak_mb`: the peak of the process the lowering ran in, where that was another
        one forked from this (`export._lower_apart`), whose pages it shared at its start."""
        import resource

        peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, psutil.Process().memory_info().rss,
                   (lowering_peak_mb or 0) * 2**20)
        return {"job_peak_rss_mb": round(peak / 2**20, 1), "job_added_rss_mb": round(max(0, peak - self.start) / 2**20, 1)}


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
