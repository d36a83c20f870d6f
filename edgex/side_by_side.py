"""Export jobs run side by side, each in its own forked child, within a memory budget.

Every job already runs in a child forked from the export's process (`edgex.isolation`), which
shares the eager model and the samples copy-on-write. Lowering is single-threaded Python and a
child runs torch on one thread, so one job at a time leaves the other cores idle: here up to
`workers` children run at once, each forked by this thread and awaited by a worker thread. Forks
happen only in this thread, between its own torch work, never while it computes.

Inputs are prepared while jobs run: the first component's jobs start as soon as it is built, and
this process builds the next components' samples (minutes of eager frames at 0.6b) beside them, in
a thread of its own. A job that can start meanwhile does not wait for the component being built:
the preparing thread pauses at its next safe point (between two module calls: no torch op under
way, its locks released) while this thread forks. The child is a copy of this thread alone, so the
preparing thread's own state (grad mode, torch-function modes) never reaches a job.

Memory: children share the parent's pages, so a job costs what it adds to them. A job starts only
while what the export holds now (this process's resident memory and each child's own pages) plus
the most a finished job of this export added stays within the budget; until one has finished, a
job is taken to add as much as the export holds. A job that must run in this process (an exporter
that is not fork-safe) runs with no other job in flight. What a job will add is known only once one
like it has finished, so two large jobs can still start together and outgrow the machine: a job
whose process the kernel killed (the OOM killer's SIGKILL) while another ran beside it runs once
more with nothing beside it.
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager, nullcontext
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
                     prepare: Callable[[int], bool | None] = lambda in_flight: False,
                     safe_points: Callable[[Callable[[], None]], AbstractContextManager] = lambda point: nullcontext(),
                     killed: Callable[[R], bool] = lambda result: False) -> list[R]:
    """Every job, up to `workers` at once, results in the order of `jobs`. `start(job)` is called in
    this thread and sets the job going (a forked child); its `result()` is awaited in a worker
    thread. `added_mb(result)`: what the finished job added to the memory it shared (None: unknown).
    `budget_mb` None: no memory limit. `alone(job)`: it runs with nothing else in flight, awaited in
    this thread. `started` / `finished` are called from this thread only.

    Jobs start in their order, each once `ready(job)`. `prepare(in_flight)` readies later jobs (builds
    their inputs), one call after another in a thread of its own until it returns False, overlapping
    the jobs (`in_flight`: how many will run meanwhile); None: it has nothing to do before a job in
    flight finishes (it is called again then). `safe_points(point)` is a context in which
    the preparing thread calls `point()` at the moments it may be paused for a fork (without one,
    only between two calls). An exception (preparing, starting) stops every job in flight.
    `killed(result)`: the job's process was killed (module doc); if another job ran beside it, it is
    started again, once, alone (neither `finished` nor `added_mb` sees the first result)."""
    results: list = [None] * len(jobs)
    pending = deque(range(len(jobs)))
    running: dict = {}  # future -> (index, Started)
    largest: float | None = None
    preparing = _Preparing(prepare, safe_points)
    accompanied: set[int] = set()  # jobs that had another beside them at some moment
    solo: set[int] = set()  # jobs to run again with nothing beside them

    def fits() -> bool:
        if not running or budget_mb is None:
            return True
        now = held()
        return now + (largest if largest is not None else now) <= budget_mb

    def collect(futures) -> None:
        nonlocal largest
        for future in futures:
            if future not in running:  # the preparing call
                continue
            preparing.waiting = False
            i, _ = running.pop(future)
            results[i] = future.result()
            if i in accompanied and i not in solo and killed(results[i]):
                solo.add(i)
                pending.appendleft(i)
                continue
            cost = added_mb(results[i])
            if cost is not None:
                largest = cost if largest is None else max(largest, cost)
            finished(jobs[i], results[i])

    def start_ready() -> None:
        while pending and len(running) < max(1, workers) and ready(jobs[pending[0]]):
            if any(i in solo for i, _ in running.values()) or (pending[0] in solo and running):
                return
            job = jobs[pending[0]]
            if alone(job):
                if running:
                    return
                i = pending.popleft()
                started(job)
                with preparing.paused():  # it shares this process's tensors with the job
                    results[i] = start(job).result()
                finished(job, results[i])
                continue
            if not fits():
                return
            i = pending.popleft()
            started(job)
            with preparing.paused():
                handle = start(job)
            if running:
                accompanied.update([i, *(j for j, _ in running.values())])
            running[pool.submit(handle.result)] = (i, handle)

    def will_run() -> int:
        return min(max(1, workers), len(running) + sum(1 for i in pending if ready(jobs[i])))

    with ThreadPoolExecutor(max(1, workers)) as pool:
        try:
            while pending or running:
                preparing.check()
                collect([f for f in running if f.done()])
                start_ready()
                if not preparing.done and preparing.future is None and not preparing.waiting:
                    preparing.next(will_run())
                if not running and preparing.future is None:
                    if preparing.waiting:  # the job it waited for finished before it returned
                        preparing.waiting = False
                        continue
                    if pending:
                        raise RuntimeError(f"job {jobs[pending[0]]!r} never became ready")
                    continue
                done, _ = wait([*running, *([preparing.future] if preparing.future else [])], return_when=FIRST_COMPLETED)
                collect(done)
        except BaseException:
            preparing.cancel()
            for _, handle in running.values():
                handle.stop()
            raise
        finally:
            preparing.close()
    return results


class _Cancelled(BaseException):
    """Raised in the preparing thread at its next safe point once the jobs have failed."""


class _Preparing:
    """`prepare` called in a thread of its own, one call at a time; `paused()` holds that thread at
    its next safe point (or between calls) for as long as the scheduling thread needs."""

    def __init__(self, prepare: Callable[[int], bool | None], safe_points: Callable[[Callable[[], None]], AbstractContextManager]):
        self._prepare, self._safe_points = prepare, safe_points
        self._executor = ThreadPoolExecutor(1)
        self._turn = threading.Condition()
        self._hold = self._held = self._cancelled = False
        self.future: Future | None = None
        self.done = False
        self.waiting = False  # the last call had nothing to do before a job finishes
        self._in_flight = 0

    def next(self, in_flight: int) -> None:
        self._in_flight = in_flight
        self.future = self._executor.submit(self._call, in_flight)

    def _call(self, in_flight: int) -> bool | None:
        with self._safe_points(self._point):
            return self._prepare(in_flight)

    def _point(self) -> None:
        with self._turn:
            if self._cancelled:
                raise _Cancelled
            if not self._hold:
                return
            self._held = True
            self._turn.notify_all()
            while self._hold:
                self._turn.wait()
            self._held = False

    def check(self) -> None:
        """The finished call's outcome: its exception raised here, False ending the preparing, None
        holding it until a job finishes."""
        if self.future is not None and self.future.done():
            future, self.future = self.future, None
            outcome = future.result()
            if outcome is None and not self._in_flight:
                raise RuntimeError("preparing waits for a job to finish, and no job will run meanwhile")
            self.waiting = outcome is None
            self.done = outcome is False

    @contextmanager
    def paused(self):
        with self._turn:
            self._hold = True
            while self.future is not None and not self.future.done() and not self._held:
                self._turn.wait(0.05)  # the call may end without reaching another safe point
        try:
            yield
        finally:
            with self._turn:
                self._hold = False
                self._turn.notify_all()

    def cancel(self) -> None:
        with self._turn:
            self._cancelled, self._hold = True, False
            self._turn.notify_all()

    def close(self) -> None:
        self._executor.shutdown(wait=True)


def default_jobs() -> int:
    """One job per core this process may run on."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
