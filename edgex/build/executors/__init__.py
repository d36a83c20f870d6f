"""Where a build's uncached jobs run: here, side by side as `edgex export` runs its jobs
(`LocalExecutor`, the default), or on a Ray cluster (`edgex.build.executors.ray_cluster`,
`--executor ray`).

Either way the driver (the process running `edgex build` or `edgex sweep`) keeps the cache: it
looks every job up before anything runs, so a cache hit never reaches an executor, and it commits
each export the executor hands back with `edgex.build.commit.settle`, the one path by which anything
enters the cache. An executor's `exports(pending, cache, progress, total)` is a context manager
whose `result(index, progress)` returns one pending job's `(manifest, files root or None,
export seconds, seconds)`, in whatever order the caller asks.
"""

from __future__ import annotations

import shutil
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from .pending import Pending

EXECUTORS = ("local", "ray")


class LocalExports:
    """Every pending job exported at the first `result` asked for, as one (`export_jobs`): side by
    side under a memory budget, each eager model built once for all the jobs that need it; each job
    committed to the cache (`settle`) as soon as it has finished, so a build stopped midway keeps
    what it finished."""

    def __init__(self, pending: list[Pending], cache, progress, total: int, workers: int | None, max_memory_mb: float | None):
        self._pending = {p.index: p for p in pending}
        self._cache, self._progress, self._total = cache, progress, total
        self._workers, self._max_memory_mb = workers, max_memory_mb
        self._results: dict[int, tuple] | None = None

    def result(self, index: int, progress: Callable[[str], None]):
        if self._results is None:
            self._results = {}
            self._run()
        return self._results.pop(index)

    def _run(self) -> None:
        from ..commit import export_jobs, settle

        items = list(self._pending.values())
        staged = [self._cache.staging(item.key) for item in items]
        started = time.perf_counter()

        def done(i: int, manifest: dict, seconds: float) -> None:
            item = items[i]
            root = settle(item.job, self._cache, item.key, item.inputs, staged[i], manifest, seconds)
            self._results[item.index] = (manifest, root, seconds, seconds)
            verdicts = ", ".join(a["verdict"] for a in manifest["artifacts"])
            self._progress(f"[{item.index + 1}/{self._total}] {item.job.id}: {verdicts} ({seconds:.1f} s; "
                           f"{time.perf_counter() - started:.1f} s into the build)")

        try:
            export_jobs(list(zip((item.job for item in items), staged)), self._progress, done, self._workers,
                        self._max_memory_mb)
        finally:
            for folder in staged:  # committed ones were renamed away
                shutil.rmtree(folder, ignore_errors=True)


class LocalExecutor:
    """The jobs here, side by side (`LocalExports`): `workers` at once (None: one per core) within
    `max_memory_mb` (None: 85 % of the memory free)."""

    def __init__(self, workers: int | None = None, max_memory_mb: float | None = None):
        self.workers, self.max_memory_mb = workers, max_memory_mb

    @contextmanager
    def exports(self, pending: list[Pending], cache, progress, total: int) -> Iterator[LocalExports]:
        yield LocalExports(pending, cache, progress, total, self.workers, self.max_memory_mb)


def make_executor(name: str, address: str | None = None, jobs: int | None = None, max_memory_gb: float | None = None):
    """The executor `--executor NAME [--address ADDRESS] [--jobs N] [--max-memory GB]` names; bad
    input is a one-line error."""
    from ...errors import EdgexError

    if name not in EXECUTORS:
        raise EdgexError(f"unknown --executor {name!r} (known: {', '.join(EXECUTORS)})")
    if name == "local":
        if address:
            raise EdgexError("--address names a Ray cluster: give it with --executor ray")
        return LocalExecutor(jobs, max_memory_gb * 1024 if max_memory_gb else None)
    if jobs is not None or max_memory_gb is not None:
        raise EdgexError("--jobs and --max-memory size the local executor: with --executor ray, each job's CPUs and "
                         "memory come from what earlier builds recorded (docs/ray.md)")
    from .ray_cluster import RayExecutor

    return RayExecutor(address)

