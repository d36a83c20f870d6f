"""Jobs side by side (`edgex.side_by_side`): never more than the workers, never past the memory
budget once a job has measured what it adds, one at a time before that, and a job that must run
in the export's own process with nothing else in flight."""

from __future__ import annotations

import threading
import time

import pytest

from edgex.side_by_side import run_side_by_side


class _Jobs:
    """Jobs that record how many ran at once; each "adds" the memory its name says."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = 0
        self.seen: list[tuple[str, int]] = []  # (job, jobs in flight when it started)

    def run(self, job: str) -> dict:
        with self.lock:
            self.now += 1
            self.seen.append((job, self.now))
        time.sleep(0.05)
        with self.lock:
            self.now -= 1
        return {"job": job, "added": float(job.split(":")[1])}

    def start(self, job: str):
        """The job set going: awaited, it runs (in the scheduler's worker thread)."""
        return _Later(lambda: self.run(job))


class _Later:
    def __init__(self, fn):
        self.result, self.stopped = fn, False

    def stop(self) -> None:
        self.stopped = True


def test_results_keep_the_order_and_no_more_than_the_workers_run_at_once():
    jobs = _Jobs()
    names = [f"j{i}:100" for i in range(7)]
    out = run_side_by_side(names, jobs.start, 3, None, added_mb=lambda r: r["added"])
    assert [r["job"] for r in out] == names
    assert max(n for _, n in jobs.seen) == 3


def test_the_budget_admits_a_job_only_while_the_largest_addition_fits():
    jobs = _Jobs()
    # 1000 MiB held, 1500 MiB budget: jobs adding 400 fit beside one another (1000 + 400 <= 1500),
    # one adding 600 does not, so every job after it runs alone
    small = [f"s{i}:400" for i in range(3)]
    run_side_by_side(small, jobs.start, 2, 1500.0, added_mb=lambda r: r["added"], held=lambda: 1000.0)
    assert jobs.seen[0] == ("s0:400", 1) and max(n for _, n in jobs.seen) == 2
    jobs = _Jobs()
    large = ["l0:600", "l1:100", "l2:100", "l3:100"]
    run_side_by_side(large, jobs.start, 2, 1500.0, added_mb=lambda r: r["added"], held=lambda: 1000.0)
    assert max(n for _, n in jobs.seen) == 1, jobs.seen
    # no measurement (jobs that report none): a job is taken to add as much as the export holds
    jobs = _Jobs()
    run_side_by_side(small, jobs.start, 2, 1000.0, added_mb=lambda r: None, held=lambda: 600.0)
    assert max(n for _, n in jobs.seen) == 1
    jobs = _Jobs()
    run_side_by_side(small, jobs.start, 2, 1200.0, added_mb=lambda r: None, held=lambda: 600.0)
    assert max(n for _, n in jobs.seen) == 2


def test_a_job_that_must_run_here_runs_with_nothing_in_flight():
    jobs = _Jobs()
    names = ["a:1", "b:1", "here:1", "c:1", "d:1"]
    started, finished = [], []
    out = run_side_by_side(names, jobs.start, 2, None, added_mb=lambda r: r["added"], alone=lambda job: job == "here:1",
                           started=started.append, finished=lambda job, result: finished.append(job))
    assert dict(jobs.seen)["here:1"] == 1 and sorted(started) == sorted(finished) == sorted(names)
    assert finished.index("a:1") < started.index("here:1") and finished.index("b:1") < started.index("here:1")
    assert [r["job"] for r in out] == names


def test_a_job_killed_beside_another_runs_once_more_alone_and_one_killed_alone_is_its_result():
    """The OOM killer's SIGKILL of a job that ran beside another: it is run again with nothing beside
    it, and only its second result is seen; a job killed while alone is not run again."""
    jobs = _Jobs()
    kills = {"big:1": 1, "lone:1": 9}  # how many of each job's runs are killed
    runs: list[str] = []

    def start(job: str):
        def run():
            result = jobs.run(job)
            runs.append(job)
            if kills.get(job, 0) > 0:
                kills[job] -= 1
                result["killed"] = True
            return result
        return _Later(run)

    names = ["big:1", "small:1", "other:1"]
    finished = []
    out = run_side_by_side(names, start, 2, None, added_mb=lambda r: r["added"], killed=lambda r: r.get("killed", False),
                           finished=lambda job, result: finished.append((job, result.get("killed", False))))
    assert runs.count("big:1") == 2 and not out[0].get("killed")
    second = [n for job, n in jobs.seen if job == "big:1"][1]
    assert second == 1, "the second run had company"
    assert ("big:1", True) not in finished and sorted(finished) == sorted((n, False) for n in names)
    assert [r["job"] for r in out] == names

    jobs, runs[:] = _Jobs(), []
    out = run_side_by_side(["lone:1"], start, 2, None, added_mb=lambda r: r["added"], killed=lambda r: r.get("killed", False))
    assert runs == ["lone:1"] and out[0]["killed"]


class _Inputs:
    """Builds one component's inputs per `prepare` call, recording how many jobs were in flight."""

    def __init__(self, components, fail_at: str | None = None):
        self.todo, self.built, self.in_flight, self.fail_at = list(components), set(), {}, fail_at

    def prepare(self, in_flight: int) -> bool:
        if not self.todo:
            return False
        name = self.todo.pop(0)
        if name == self.fail_at:
            raise ValueError(f"{name}: its samples could not be made")
        time.sleep(0.1)  # eager frames
        self.in_flight[name] = in_flight
        self.built.add(name)
        return True

    def ready(self, job: str) -> bool:
        return job[0] in self.built


def test_later_components_are_built_while_the_first_one_s_jobs_run():
    jobs, inputs = _Jobs(), _Inputs("abc")
    names = ["a0:1", "a1:1", "b0:1", "c0:1", "c1:1"]
    started = []
    out = run_side_by_side(names, lambda job: _Later(lambda: (time.sleep(0.3), jobs.run(job))[1]), 2, None,
                           added_mb=lambda r: r["added"], started=started.append, ready=inputs.ready, prepare=inputs.prepare)
    assert [r["job"] for r in out] == names and started == names
    assert inputs.in_flight == {"a": 0, "b": 2, "c": 2}  # b and c were built beside a's two jobs


def test_a_component_that_cannot_be_built_stops_the_jobs_in_flight():
    inputs, handles = _Inputs("ab", fail_at="b"), []

    def start(job):
        handles.append(_Later(lambda: time.sleep(0.2) or {"job": job, "added": 1.0}))
        return handles[-1]

    with pytest.raises(ValueError, match="b: its samples could not be made"):
        run_side_by_side(["a0:1", "a1:1", "b0:1"], start, 2, None, added_mb=lambda r: r["added"], ready=inputs.ready,
                         prepare=inputs.prepare)
    assert len(handles) == 2 and all(h.stopped for h in handles)


def test_a_job_starts_while_a_component_is_built_with_the_builder_paused_at_a_safe_point():
    """A ready job whose turn comes while a later component is being built starts then, not after:
    the preparing thread is held at a safe point for the fork, and goes on after it."""
    from contextlib import contextmanager

    state = {"point": None, "inside": False, "built": set(), "starts": []}

    @contextmanager
    def safe_points(point):
        def at_point():
            state["inside"] = True
            point()
            state["inside"] = False

        state["point"] = at_point
        yield
        state["point"] = None

    def prepare(in_flight: int) -> bool:
        todo = [c for c in "ab" if c not in state["built"]]
        if not todo:
            return False
        for _ in range(100 if todo[0] == "b" else 1):  # b: a second of eager work in steps
            time.sleep(0.01)
            if state["point"]:
                state["point"]()
        state["built"].add(todo[0])
        return True

    def start(job):
        state["starts"].append((job, "b" in state["built"], state["inside"]))
        return _Later(lambda: time.sleep(0.05) or {"job": job, "added": 1.0})

    names = ["a0:1", "a1:1", "a2:1", "a3:1", "b0:1"]
    out = run_side_by_side(names, start, 2, None, added_mb=lambda r: r["added"], ready=lambda job: job[0] in state["built"],
                           prepare=prepare, safe_points=safe_points)
    assert [r["job"] for r in out] == names
    by_job = {job: (b_built, inside) for job, b_built, inside in state["starts"]}
    # a2 and a3 waited only for a0 / a1, not for b: each started from a paused builder
    assert by_job["a2:1"] == (False, True) and by_job["a3:1"] == (False, True)
    assert by_job["b0:1"][0]


def test_whole_graph_compiles_take_turns_and_a_killed_holder_releases_its_turn(tmp_path):
    """`lowering_turns`: forked jobs whose lowering is `lowering_alone` never compile at once; one
    killed while holding its turn hands it on (the kernel drops its lock); a job that needs no turn,
    or runs outside an export's `turns()`, does not wait."""
    import os
    import signal

    from edgex import lowering_turns

    log = tmp_path / "log"

    def child(name: str, hold: float, needed: bool = True) -> int:
        pid = os.fork()
        if pid == 0:
            with lowering_turns.turn(needed):
                with open(log, "a") as f:
                    f.write(f"{name} in {time.time()}\n")
                time.sleep(hold)
                with open(log, "a") as f:
                    f.write(f"{name} out {time.time()}\n")
            os._exit(0)
        return pid

    with lowering_turns.turns():
        first = child("first", 30.0)  # killed while it holds the turn
        time.sleep(0.3)
        second, free = child("second", 0.3), child("free", 0.0, needed=False)
        time.sleep(0.5)
        os.waitpid(free, 0)
        assert "second in" not in log.read_text() and "free out" in log.read_text()
        os.kill(first, signal.SIGKILL)
        os.waitpid(first, 0)
        os.waitpid(second, 0)
        assert "second out" in log.read_text()
    assert lowering_turns._PATH is None
    with lowering_turns.turn(True) as waited:  # no export set turns up: nothing to wait for
        assert waited == [0.0]
