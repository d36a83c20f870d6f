"""Export jobs run side by side, each in its own forked child, within a memory budget.

Every job already runs in a child forked from the export's process (`edgex.isolation`), which
shares the eager model and the samples copy-on-write. Lowering is single-threaded Python and a
child runs torch on one thread, so one job at a time leaves the other cores idle: here up to
`workers` children run at once, each forked by this thread and awaited by a worker thread. Forks
happen only in this thread, between its own torch work, never while it computes.

Inputs are prepared while jobs run: the first component's jobs start as soon as it is built, and
this process builds the next components' samples (minutes of eager frames at 0.6b) beside them.

Memory: children share the parent's pages, so a job costs what it adds to them. A job starts only
while what the export holds now (this process's resident memory and each child's own pages) plus
the most a finished job of this export added stays within the budget; until one has finished, a
job is taken to add as much as the export holds. A job that must run in this process (an exporter
that is not fork-safe) runs with no other job in flight.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Callable, Protocol, Sequence, TypeVar

import psutil

J = TypeVar("J")
R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

MB = 2**20
# The share of the memory available at the start an automatic budget allows the export to fill.
AUTO_BUDGET_SHARE = 0.85


def held_mb() -> float:
    """This process's resident memory plus its children's own (unique) pages, in MiB."""
    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_full_info().uss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return total / MB


def auto_budget_mb() -> float:
    """What the export holds now plus a share of the memory the machine has free."""
    return held_mb() + AUTO_BUDGET_SHARE * psutil.virtual_memory().available / MB


class Started(Protocol[R_co]):
    """A job under way: `result()` waits for it (in a thread of this process), `stop()` ends it."""

    def result(self) -> R_co: ...

    def stop(self) -> None: ...


def run_side_by_side(jobs: Sequence[J], start: Callable[[J], Started[R]], workers: int, budget_mb: float | None,
                     added_mb: Callable[[R], float | None], alone: Callable[[J], bool] = lambda job: False,
                     started: Callable[[J], None] = lambda job: None, finished: Callable[[J, R], None] = lambda job, result: None,
                     held: Callable[[], float] = held_mb, ready: Callable[[J], bool] = lambda job: True,
                     prepare: Callable[[int], bool] = lambda in_flight: False) -> list[R]:
    """Every job, up to `workers` at once, results in the order of `jobs`. `start(job)` is called in
    this thread and sets the job going (a forked child); its `result()` is awaited in a worker
    thread. `added_mb(result)`: what the finished job added to the memory it shared (None: unknown).
    `budget_mb` None: no memory limit. `alone(job)`: it runs with nothing else in flight, awaited in
    this thread. `started` / `finished` are called from this thread only.

    Jobs start in their order, each once `ready(job)`. Whenever this thread would otherwise wait, it
    calls `prepare(in_flight)` (the number of jobs running meanwhile), which readies later jobs (builds
    their inputs) and returns False once there is nothing left to prepare: preparing overlaps the jobs
    already running. An exception here (preparing, starting) stops every job in flight."""
    results: list = [None] * len(jobs)
    pending = deque(range(len(jobs)))
    running: dict = {}  # future -> (index, Started)
    largest: float | None = None
    preparing = True

    def fits() -> bool:
        if not running or budget_mb is None:
            return True
        now = held()
        return now + (largest if largest is not None else now) <= budget_mb

    def collect(futures) -> None:
        nonlocal largest
        for future in futures:
            i, _ = running.pop(future)
            results[i] = future.result()
            cost = added_mb(results[i])
            if cost is not None:
                largest = cost if largest is None else max(largest, cost)
            finished(jobs[i], results[i])

    def start_ready() -> None:
        while pending and len(running) < max(1, workers) and ready(jobs[pending[0]]):
            job = jobs[pending[0]]
            if alone(job):
                if running:
                    return
                i = pending.popleft()
                started(job)
                results[i] = start(job).result()
                finished(job, results[i])
                continue
            if not fits():
                return
            i = pending.popleft()
            started(job)
            handle = start(job)
            running[pool.submit(handle.result)] = (i, handle)

    with ThreadPoolExecutor(max(1, workers)) as pool:
        try:
            while pending or running:
                collect([f for f in running if f.done()])
                start_ready()
                if preparing and (pending or running):
                    preparing = prepare(len(running))
                    if preparing:
                        continue
                if not running:
                    if pending:
                        raise RuntimeError(f"job {jobs[pending[0]]!r} never became ready")
                    continue
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                collect(done)
        except BaseException:
            for _, handle in running.values():
                handle.stop()
            raise
    return results


def default_jobs() -> int:
    """One job per core this process may run on."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
