"""The one scheduler every export goes through (`edgex.scheduler`), on stand-in models and jobs:
each model is built once however many jobs (of however many exports) need it, each component once;
jobs run side by side; the next model is built beside the last jobs of the one before only while the
budget holds both, else once they have finished; a model is dropped with its last job."""

from __future__ import annotations

import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgex import scheduler
from edgex.plan import Job
from edgex.scheduler import Source, Task, run_tasks


class _Log:
    def __init__(self):
        self.lock = threading.Lock()
        self.events: list[tuple] = []
        self.now = 0
        self.most = 0  # jobs in flight at once, at most

    def add(self, *event) -> None:
        with self.lock:
            self.events.append(event)

    def index(self, *event) -> int:
        return self.events.index(event)


LOG = _Log()
LOADED: dict[str, weakref.ref] = {}


class _Loaded(SimpleNamespace):
    """A stand-in `LoadedModel` (weak references: whether it is still held)."""


@dataclass(frozen=True)
class _Source(Source):
    """A stand-in model: loading and building its components are logged, and take a little time."""

    def load(self):
        LOG.add("load", self.model)
        time.sleep(0.05)
        loaded = _Loaded(models=None, source={"preset": self.preset, "model": self.model}, options={})
        LOADED[self.model] = weakref.ref(loaded)
        return loaded

    def components(self, loaded, names):
        for name in names:
            LOG.add("build", self.model, name)
            yield _Component(self.model, name)


class _Component:
    def __init__(self, model: str, name: str):
        self.model, self.name = model, name

    def compute_references(self, reads: bool) -> None:
        time.sleep(0.02)


class _Running:
    def __init__(self, model: str, job: Job, component: _Component):
        assert component.model == model and component.name == job.component
        self.model, self.job = model, job

    def result(self) -> list[dict]:
        if self.model == "b" and "a" in LOADED:
            LOG.add("running b with a alive", LOADED["a"]() is not None)
        with LOG.lock:
            LOG.now += 1
            LOG.most = max(LOG.most, LOG.now)
        time.sleep(0.1)
        with LOG.lock:
            LOG.now -= 1
        LOG.add("done", self.model, self.job.component, self.job.precision)
        return [{"verdict": "pass", "job_added_rss_mb": 100.0}]

    def stop(self) -> None:
        pass


def _tasks(tmp_path: Path, plan: list[tuple[str, str, str]]) -> list[Task]:
    tasks = []
    for model, component, precision in plan:
        job = Job(component, "talker", "onnx", precision)
        tasks.append(Task(_Source(model, "tiny", None, 0, "{}"), job,
                          lambda comp, model=model, job=job: _Running(model, job, comp), tmp_path))
    return tasks


@pytest.fixture(autouse=True)
def fresh_log(monkeypatch):
    monkeypatch.setattr(scheduler, "warm_up", lambda jobs: None)
    LOG.__init__()


def test_each_model_and_component_is_built_once_and_jobs_run_side_by_side(tmp_path):
    # two exports of one model (a prefill and a decode each, as two targets would ask) and one of another
    plan = [("a", "prefill", "fp32"), ("a", "decode", "fp32"), ("b", "decode", "fp16"),
            ("a", "prefill", "fp16"), ("a", "decode", "fp16")]
    described = []
    tasks = _tasks(tmp_path, plan)
    for task in tasks:
        task.finished = lambda entries, records: described.append(records[0]["model"])
    results, models = run_tasks(tasks, 2, None, lambda message: None)
    assert [e for e in LOG.events if e[0] in ("load", "build")] == [
        ("load", "a"), ("build", "a", "prefill"), ("build", "a", "decode"), ("load", "b"), ("build", "b", "decode")]
    assert results == [[{"verdict": "pass", "job_added_rss_mb": 100.0}]] * 5
    assert LOG.most == 2
    assert sorted(described) == ["a"] * 4 + ["b"]
    assert [s.model for s in models.loads] == ["a", "b"]
    # the second model was built while the first one's jobs ran: no budget holds it back
    assert LOG.index("load", "b") < max(LOG.index("done", "a", c, p) for _, c, p in [t for t in plan if t[0] == "a"])


def test_the_next_model_waits_for_the_last_jobs_of_the_one_before_when_the_budget_cannot_hold_both(tmp_path, monkeypatch):
    plan = [("a", "decode", "fp32"), ("a", "decode", "fp16"), ("a", "decode", "w8a16"), ("b", "decode", "fp32")]
    costs = iter([1000.0, 1900.0, 1000.0, 1900.0])  # what the process held before and after model a: it added 900 MB
    monkeypatch.setattr(scheduler, "_rss_mb", lambda: next(costs))
    run_tasks(_tasks(tmp_path, plan), 2, 1500.0, lambda message: None, held=lambda: 1000.0)
    last_of_a = max(LOG.index("done", "a", "decode", p) for p in ("fp32", "fp16", "w8a16"))
    assert LOG.index("load", "b") > last_of_a
    assert LOG.most == 2


def test_a_model_is_dropped_when_its_last_job_has_finished(tmp_path):
    tasks = _tasks(tmp_path, [("a", "decode", "fp32"), ("b", "decode", "fp32")])
    run_tasks(tasks, 1, None, lambda message: None)
    assert ("running b with a alive", False) in LOG.events


def _record(tmp_path, monkeypatch, seconds: dict[str, float]) -> None:
    """Costs as a finished export of model `a` (preset tiny, onnx fp32 jobs) records them."""
    import json

    from edgex.progress import JobCosts

    monkeypatch.setenv("EDGEX_CACHE_DIR", str(tmp_path / "cache"))
    path = JobCosts.of("a", "tiny", None).path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({f"a|preset:tiny|{c}|onnx|fp32": s for c, s in seconds.items()}))


def test_the_longest_recorded_job_is_built_and_started_first(tmp_path, monkeypatch):
    # as a 0.6b Qwen3-TTS s25-htp export records them: the unrolled frame is the longest by far
    _record(tmp_path, monkeypatch, {"prefill": 216.0, "decode": 155.0, "frame": 732.0, "step": 49.0})
    plan = [("a", c, "fp32") for c in ("prefill", "decode", "frame", "step")]
    run_tasks(_tasks(tmp_path, plan), 1, None, lambda message: None)
    assert [e[2] for e in LOG.events if e[0] == "build"] == ["frame", "prefill", "decode", "step"]
    assert [e[2] for e in LOG.events if e[0] == "done"] == ["frame", "prefill", "decode", "step"]


def test_a_long_job_does_not_run_beside_another_the_budget_cannot_hold(tmp_path, monkeypatch):
    _record(tmp_path, monkeypatch, {"prefill": 216.0, "frame": 732.0})
    run_tasks(_tasks(tmp_path, [("a", "prefill", "fp32"), ("a", "frame", "fp32")]), 2, 1500.0, lambda message: None,
              held=lambda: 1000.0)
    assert LOG.most == 1  # the budget decides what runs beside what, whatever the order
    assert [e[2] for e in LOG.events if e[0] == "done"] == ["frame", "prefill"]


def test_expected_costs_come_from_the_record_of_every_job_else_from_unrolled_steps_and_format(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEX_CACHE_DIR", str(tmp_path / "cache"))
    source = Source.of("qwen3-tts", "0.6b", None, 0, {})
    plan = [("talker_prefill", "qnn", "fp16"), ("code2wav", "onnx", "fp32"), ("code_predictor", "qnn", "fp16"),
            ("talker_decode", "qnn", "fp16")]
    tasks = [Task(source, Job(c, "talker", e, p), lambda comp: None, tmp_path) for c, e, p in plan]
    # nothing recorded: the predictor frame's 15 unrolled steps on the HTP path first, the ONNX job last
    costs = scheduler.expected_costs(tasks)
    assert costs == [3.0, 1.0, 45.0, 3.0]
    assert scheduler.longest_first(tasks, costs) == [2, 0, 3, 1]
    # every job recorded: their seconds decide (here the decode graph before the prefill)
    from edgex.progress import JobCosts

    recorded = JobCosts.of("qwen3-tts", "0.6b", None)
    recorded.record({"artifacts": [{"component": c, "exporter": e, "precision": p, "job_seconds": s}
                                   for (c, e, p), s in zip(plan, (150.0, 20.0, 700.0, 200.0))]})
    costs = scheduler.expected_costs(tasks)
    assert costs == [150.0, 20.0, 700.0, 200.0]
    assert scheduler.longest_first(tasks, costs) == [2, 3, 0, 1]
