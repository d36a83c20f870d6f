"""The one scheduler every export goes through: `edgex export`, `edgex build`, `edgex sweep`, and a
Ray node's share of a build (`edgex.build.executors`) hand it their jobs.

Each eager model is built once per `Source` (recipe, weights, seed, build options), with the
components its jobs need and every sample's eager reference, and shared by every job that needs
it, whichever export, target or build entry the job belongs to. The jobs run side by side under a
memory budget (`edgex.side_by_side`), each in a process forked from this one (`edgex.isolation`),
which shares the model, samples and references copy-on-write.

Order: the jobs of one model run together, models in the order their first job was given, each
component's jobs as soon as it is built (its references computed in this process while the jobs
of the components before it run). Within a model, the longest first: its components by their
longest job's expected cost, each component's jobs by theirs (ties in the order given); on two
workers the longest job started last would otherwise set the wall (longest-processing-time-first,
the usual rule for a few machines: a Qwen3-TTS 0.6b s25-htp export's 12-minute predictor frame
started at 4 minutes, behind the talker's jobs, ended the export at 16). A job's expected cost is
known before it runs (`expected_costs`): the wall seconds the export cache records for it
(`edgex.progress.JobCosts`, written by every finished export) when it records every job of the
model, else an estimate in relative units, the same for all of them: the passes its graph unrolls
(`RecipeFacts.unrolled_steps`, 1 where not declared) times its exporter's `cost_weight`. The memory
budget still decides what runs beside what: a job that would not fit waits, whatever its cost.
The next model is loaded while the last jobs of the one before
run when the budget holds both (what the one before added to this process when it was built, on top
of what is held now); otherwise once those jobs have finished. A model is dropped when its last job
has finished.
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from .component import Component
from .exporters import EXPORTERS
from .isolation import between_module_calls, forking_supported
from .lowering_turns import turns
from .mapped_weights import map_weights
from .plan import Job
from .recipes import RECIPES
from .resources import return_free_memory
from .side_by_side import Started, default_jobs, held_mb, run_side_by_side


@dataclass(frozen=True)
class Source:
    """What an eager model and its samples are a function of: two jobs with equal sources share one."""

    model: str
    preset: str | None
    checkpoint: str | None
    seed: int
    options: str  # the recipe's parsed build options, as sorted JSON

    @classmethod
    def of(cls, model: str, preset: str | None, checkpoint: Path | None, seed: int, options: dict) -> "Source":
        return cls(model, preset, str(checkpoint) if checkpoint else None, seed,
                   json.dumps(options or {}, sort_keys=True, default=str))

    def load(self):
        """The recipe's `LoadedModel`."""
        return RECIPES.get(self.model).load(self.preset, Path(self.checkpoint) if self.checkpoint else None, self.seed,
                                            json.loads(self.options))

    def components(self, loaded, names: list[str]) -> Iterator[Component]:
        """The named components of `loaded`, each built when the iterator is advanced to it."""
        return RECIPES.get(self.model).iter_components(loaded, names)


@dataclass
class Task:
    """One job to run on its source's model: `start(component)` sets it going (`Started`), in a
    process forked from this one or here; `started()` / `finished(entries, described)` are called
    around it from the scheduling thread (`described`: the model's `source` and `options` records,
    None where no model was built for it). `scratch`: a folder on the output's disk, where the
    model's weights file is written (`map_weights`) when this is its source's first task."""

    source: Source
    job: Job
    start: Callable[[Component], Started]
    scratch: Path
    started: Callable[[], None] = lambda: None
    finished: Callable[[list[dict], tuple[dict, dict] | None], None] = lambda entries, described: None


@dataclass
class _Model:
    """One source's model while its jobs need it: the components built so far."""

    source: Source
    names: list[str]  # its jobs' components, in the order their first job was given
    reads: set[str]  # components some job casts its graph for or rounds its reference's weights for
    left: int  # its jobs not finished
    loaded: object = None
    components: object = None  # the recipe's component iterator
    built: dict[str, Component] = field(default_factory=dict)
    rss_at_load_mb: float = 0.0
    cost_mb: float = 0.0  # what loading and building it added to this process's resident memory


class Models:
    """The preparing side of `run_tasks`: each source's model loaded, then its components built one
    at a time, the next model only once the budget holds it (module doc). `described[source]`: the
    loaded model's `source` and `options` records, kept after the model is dropped."""

    def __init__(self, tasks: list[Task], budget_mb: float | None, progress: Callable[[str], None],
                 held: Callable[[], float] = held_mb):
        self._order: list[_Model] = []
        by_source: dict[Source, _Model] = {}
        for task in tasks:
            model = by_source.get(task.source)
            if model is None:
                model = by_source[task.source] = _Model(task.source, [], set(), 0)
                self._order.append(model)
            model.left += 1
            if task.job.component not in model.names:
                model.names.append(task.job.component)
            if task.job.precision != "fp32":
                model.reads.add(task.job.component)
        self._by_source = by_source
        self._scratch = {s: next(t.scratch for t in tasks if t.source == s) for s in by_source}
        self._next = 0  # index of the model being prepared
        self._budget, self._progress, self._held = budget_mb, progress, held
        self.described: dict[Source, tuple[dict, dict]] = {}
        self.loads: list[Source] = []  # every model load, in order

    def component(self, task: Task) -> Component | None:
        return self._by_source[task.source].built.get(task.job.component)

    def next(self, in_flight: int, meanwhile: Callable[[], object] | None = None) -> bool | None:
        """Load the next model or build its next component: True; False when every one is built;
        None when the next model must wait for the last jobs of the one before (`done`).
        `meanwhile`: work for this thread while a loaded model's weights file is written."""
        import torch

        if self._next == len(self._order):
            return False
        model = self._order[self._next]
        if model.loaded is None and in_flight and not self._room():
            return None
        threads = torch.get_num_threads()
        if in_flight:
            torch.set_num_threads(max(1, default_jobs() - in_flight))
        try:
            if model.loaded is None:
                self._load(model, meanwhile)
                return True
            self._progress(f"building {model.names[len(model.built)]} from the eager pipeline")
            component = next(model.components)
            _references(component, component.name in model.reads)
        finally:
            torch.set_num_threads(threads)
        model.built[component.name] = component
        if len(model.built) == len(model.names):
            model.cost_mb = _rss_mb() - model.rss_at_load_mb
            model.components = None
            self._next += 1
        return True

    def _room(self) -> bool:
        """Whether the next model may be built beside the jobs of those before it that run still."""
        before = [m for m in self._order[: self._next] if m.left]
        if not before or self._budget is None:
            return True
        return self._held() + max(m.cost_mb for m in before) <= self._budget

    def _load(self, model: _Model, meanwhile: Callable[[], object] | None) -> None:
        self._progress(f"loading {model.source.model} ({model.source.preset or 'checkpoint ' + str(model.source.checkpoint)})")
        model.rss_at_load_mb = _rss_mb()
        model.loaded = model.source.load()
        self.loads.append(model.source)
        self.described[model.source] = (dict(model.loaded.source), dict(model.loaded.options))
        if forking_supported():  # the jobs fork: they share the weights as page cache
            map_weights(model.loaded.models, self._scratch[model.source], meanwhile=meanwhile)
        elif meanwhile is not None:
            meanwhile()
        model.components = model.source.components(model.loaded, model.names)

    def done(self, task: Task) -> None:
        """A task has finished: its model is dropped with its last one."""
        model = self._by_source[task.source]
        model.left -= 1
        if model.left == 0 and model.components is None:
            model.loaded, model.built = None, {}
            gc.collect()
            return_free_memory()


def _rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _references(component: Component, reads: bool) -> None:
    """Every sample's eager reference, computed here before the component's jobs fork (a child runs
    torch on one thread) and shared with every job of the component; with `reads`
    (some job casts its graph or rounds its reference's weights), the tensors the reference and the
    module read too (`Component.compute_references`). The freed pages of that work go back to the
    system, as the children would carry them."""
    component.compute_references(reads)
    gc.collect()
    return_free_memory()


_WARM: set[str] = set()  # exporters warmed up in this process


def warm_up(jobs: list[Job]) -> None:
    """Each exporter's one-time costs, paid in this process once rather than in every forked job.
    Best effort: an exporter that cannot warm up fails its jobs with the real error instead."""
    if not forking_supported():
        return
    for name in dict.fromkeys(job.exporter for job in jobs):
        if name in _WARM:
            continue
        _WARM.add(name)
        try:
            EXPORTERS.get(name).warm_up()
        except Exception:  # noqa: BLE001 - the job reports it
            pass


def run_tasks(tasks: list[Task], workers: int, budget_mb: float | None, progress: Callable[[str], None],
              held: Callable[[], float] = held_mb) -> tuple[list[list[dict]], Models]:
    """Every task's entries, in the order given, and the `Models` that built their inputs. Jobs of
    one model are started together, longest first (module doc); `workers` at most at once, a job beside others
    only while `budget_mb` holds it (None: no limit)."""
    order = longest_first(tasks, expected_costs(tasks))
    ordered = [tasks[i] for i in order]
    models = Models(ordered, budget_mb, progress, held)
    # In this thread, before any job forks: the first model, and meanwhile every exporter's warm-up
    # (each job's process inherits it warm), whichever model's jobs use it.
    if ordered:
        models.next(0, meanwhile=lambda: warm_up([t.job for t in ordered]))

    def finished(task: Task, entries: list[dict]) -> None:
        models.done(task)
        task.finished(entries, models.described[task.source])

    started = time.perf_counter()
    with turns():  # whole-graph compiles (`lowering_alone`) take turns
        made = run_side_by_side(
            ordered, lambda task: task.start(models.component(task)), workers, budget_mb,
            added_mb=lambda entries: entries[0].get("job_added_rss_mb"),
            alone=lambda task: not (EXPORTERS.get(task.job.exporter).fork_safe and forking_supported()),
            started=lambda task: task.started(), finished=finished,
            ready=lambda task: models.component(task) is not None, prepare=models.next, safe_points=between_module_calls,
            held=held, killed=lambda entries: entries[0].get("killed_by") == "SIGKILL")
    results: list = [None] * len(tasks)
    for i, entries in zip(order, made):
        results[i] = entries
    progress(f"{len(tasks)} job(s) of {len(models.loads)} model(s) in {time.perf_counter() - started:.1f} s")
    return results, models


def expected_costs(tasks: list[Task]) -> list[float]:
    """Each task's expected cost (module doc): per model, the recorded seconds of its jobs where the
    export cache holds every one, else `unrolled steps x cost_weight` for all of them."""
    from .progress import JobCosts

    costs = [0.0] * len(tasks)
    by_source: dict[Source, list[int]] = {}
    for i, task in enumerate(tasks):
        by_source.setdefault(task.source, []).append(i)
    for source, indices in by_source.items():
        recorded = JobCosts.of(source.model, source.preset, source.checkpoint)
        seconds = [recorded.get(tasks[i].job) for i in indices]
        if all(s is not None for s in seconds):
            for i, s in zip(indices, seconds):
                costs[i] = float(s)
            continue
        steps = getattr(RECIPES.facts(source.model), "unrolled_steps", {}) if source.model in RECIPES.names() else {}
        for i in indices:
            job = tasks[i].job
            costs[i] = steps.get(job.component, 1) * EXPORTERS.get(job.exporter).cost_weight
    return costs


def longest_first(tasks: list[Task], costs: list[float]) -> list[int]:
    """The order the tasks start in (module doc), as indices: models by their first task; within one,
    components by their longest job, then each component's jobs, longest first; ties as given."""
    first_source: dict[Source, int] = {}
    first_component: dict[tuple[Source, str], int] = {}
    longest: dict[tuple[Source, str], float] = {}
    for i, task in enumerate(tasks):
        key = (task.source, task.job.component)
        first_source.setdefault(task.source, i)
        first_component.setdefault(key, i)
        longest[key] = max(longest.get(key, costs[i]), costs[i])

    def order(i: int) -> tuple:
        key = (tasks[i].source, tasks[i].job.component)
        return first_source[tasks[i].source], -longest[key], first_component[key], -costs[i], i

    return sorted(range(len(tasks)), key=order)
