"""Export jobs run side by side, each in its own forked child, within a memory budget.

Every job already runs in a child forked from the export's process (`edgex.isolation`), which
shares the eager model and the samples copy-on-write. Lowering is single-threaded Python and a
child runs torch on one thread, so one job at a time leaves the other cores idle: here up to
`workers` children run at once, each forked and awaited by a thread of this process.

Memory: children share the parent's pages, so a job costs what it adds to them. A job starts only
while what the export holds now (this process's resident memory and each child's own pages) plus
the most a finished job of this export added stays within the budget; until one has finished, a
job is taken to add as much as the export holds. A job that must run in this process (an exporter
that is not fork-safe) runs with no other job in flight.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Callable, Sequence, TypeVar

import psutil

J = TypeVar("J")
R = TypeVar("R")

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


def run_side_by_side(jobs: Sequence[J], run: Callable[[J], R], workers: int, budget_mb: float | None,
                     added_mb: Callable[[R], float | None], alone: Callable[[J], bool] = lambda job: False,
                     started: Callable[[J], None] = lambda job: None, finished: Callable[[J, R], None] = lambda job, result: None,
                     held: Callable[[], float] = held_mb) -> list[R]:
    """`run(job)` for every job, up to `workers` at once in threads (each forks its job's child),
    results in the order of `jobs`. `added_mb(result)`: what the finished job added to the memory it
    shared (None: unknown). `budget_mb` None: no memory limit. `alone(job)`: it runs in this thread,
    with nothing else in flight. `started` / `finished` are called from this thread only."""
    results: list = [None] * len(jobs)
    pending = deque(range(len(jobs)))
    running: dict = {}
    largest: float | None = None

    def fits() -> bool:
        if not running or budget_mb is None:
            return True
        now = held()
        return now + (largest if largest is not None else now) <= budget_mb

    with ThreadPoolExecutor(max(1, workers)) as pool:
        while pending or running:
            while pending and len(running) < max(1, workers):
                job = jobs[pending[0]]
                if alone(job):
                    if running:
                        break
                    i = pending.popleft()
                    started(job)
                    results[i] = run(job)
                    finished(job, results[i])
                    continue
                if not fits():
                    break
                i = pending.popleft()
                started(job)
                running[pool.submit(run, job)] = i
            if not running:
                continue
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                i = running.pop(future)
                results[i] = future.result()
                cost = added_mb(results[i])
                if cost is not None:
                    largest = cost if largest is None else max(largest, cost)
                finished(jobs[i], results[i])
    return results


def default_jobs() -> int:
    """One job per core this process may run on."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
