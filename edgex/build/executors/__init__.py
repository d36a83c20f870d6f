"""Where a build's uncached jobs run: here, one after another (`LocalExecutor`, the default), or as
tasks on a Ray cluster (`edgex.build.executors.ray_cluster`, `--executor ray`).

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
    def __init__(self, pending: list[Pending], cache):
        self._pending = {p.index: p for p in pending}
        self._cache = cache

    def result(self, index: int, progress: Callable[[str], None]):
        from ..commit import export_job, settle

        item = self._pending.pop(index)
        progress("exporting")
        started = time.perf_counter()
        staged = self._cache.staging(item.key)
        try:
            manifest = export_job(item.job, staged, progress)
            export_seconds = round(time.perf_counter() - started, 3)
            root = settle(item.job, self._cache, item.key, item.inputs, staged, manifest, export_seconds)
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise
        return manifest, root, export_seconds, round(time.perf_counter() - started, 3)


class LocalExecutor:
    """Each job in this process, when its result is asked for."""

    @contextmanager
    def exports(self, pending: list[Pending], cache, progress, total: int) -> Iterator[LocalExports]:
        yield LocalExports(pending, cache)


def make_executor(name: str, address: str | None = None):
    """The executor `--executor NAME [--address ADDRESS]` names; bad input is a one-line error."""
    from ...errors import EdgexError

    if name not in EXECUTORS:
        raise EdgexError(f"unknown --executor {name!r} (known: {', '.join(EXECUTORS)})")
    if name == "local":
        if address:
            raise EdgexError("--address names a Ray cluster: give it with --executor ray")
        return None
    from .ray_cluster import RayExecutor

    return RayExecutor(address)
