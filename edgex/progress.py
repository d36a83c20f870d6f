"""Progress over an export's jobs for the CLI: done / total, elapsed time and an estimate of the rest.

The estimate comes from each job's recorded cost: every finished export records its jobs' wall
seconds (`job_seconds` in the manifest) in a small cache keyed by model, weights, component,
format and precision; the next run sums the recorded costs of the jobs still to do (a job never
seen before counts as the average of the known ones, or of this run's finished ones) and divides
by the worker count, plus the recorded setup (loading the model, building its components: the
run's wall time the jobs do not account for) until the first job starts. On a terminal this is a
rich progress bar, with a line per finished job above it; piped (CI logs) one plain line per
finished job, and a line for a setup stage (loading the model, building a component) that has
lasted `STAGE_QUIET_S` (a published-size model's load and references take minutes, which a CI log
would otherwise show as silence; a quicker stage, and a bad input caught in it, print nothing
extra); `--json` runs print nothing extra.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from .plan import ExportPlan, Job
from .status import VERDICTS


STAGE_QUIET_S = 30.0  # piped: a setup stage gets a line once it has lasted this long
PEAK = "|peak_rss_mb"  # a job's key plus this: its recorded peak memory (`JobCosts.peak_mb`)


def cache_dir() -> Path:
    return Path(os.environ.get("EDGEX_CACHE_DIR") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgex")


def clock(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else f"{seconds // 60}:{seconds % 60:02d}"


class JobCosts:
    """Recorded wall seconds and peak resident memory per job, in `<cache>/job-costs.json`;
    unreadable or missing = none. A job's peak (`job_peak_rss_mb`, MiB) sits beside its seconds under
    the same key plus `|peak_rss_mb`: what `edgex.memory_needs` takes as the job's need next time."""

    def __init__(self, plan: ExportPlan, path: Path | None = None):
        self._open(plan.recipe.name, plan.preset or plan.recipe.default_preset, plan.checkpoint, path)

    @classmethod
    def of(cls, recipe: str, preset: str | None, checkpoint: str | Path | None, path: Path | None = None) -> "JobCosts":
        """The recorded costs of one model's jobs: `recipe` with `checkpoint`, else with `preset`."""
        costs = cls.__new__(cls)
        costs._open(recipe, preset, checkpoint, path)
        return costs

    def _open(self, recipe: str, preset: str | None, checkpoint, path: Path | None) -> None:
        self.path = path or cache_dir() / "job-costs.json"
        source = f"checkpoint:{checkpoint}" if checkpoint else f"preset:{preset}"
        self._prefix = f"{recipe}|{source}|"
        try:
            self._costs: dict[str, float] = json.loads(self.path.read_text())
        except (OSError, ValueError):
            self._costs = {}

    def _key(self, component: str, exporter: str, precision: str) -> str:
        return f"{self._prefix}{component}|{exporter}|{precision}"

    def get(self, job: Job) -> float | None:
        return self._costs.get(self._key(job.component, job.exporter, job.precision))

    def peak_mb(self, job: Job) -> float | None:
        """The job's peak resident memory in the last export that ran it, in MiB."""
        return self._costs.get(self._key(job.component, job.exporter, job.precision) + PEAK)

    @property
    def setup(self) -> float | None:
        """Seconds before the first job: loading the model and building its components."""
        return self._costs.get(f"{self._prefix}setup")

    def record(self, manifest: dict, workers: int = 1) -> None:
        """Keep this run's per-job seconds and peak memory (and what the rest of its wall time cost)
        for the next estimate. Best effort: a read-only cache only costs the estimate."""
        seconds = []
        for entry in manifest.get("artifacts", []):
            if "job_seconds" in entry and not entry.get("reused"):
                key = self._key(entry["component"], entry["exporter"], entry["precision"])
                self._costs[key] = entry["job_seconds"]
                seconds.append(entry["job_seconds"])
                if entry.get("job_peak_rss_mb") is not None:
                    self._costs[key + PEAK] = entry["job_peak_rss_mb"]
        if seconds and "seconds" in manifest:
            self._costs[f"{self._prefix}setup"] = round(max(0.0, manifest["seconds"] - sum(seconds) / max(1, workers)), 3)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
            tmp.write_text(json.dumps(self._costs, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
        except OSError:
            pass


class _Left(ProgressColumn):
    """Time left until the estimated finish, counting down between events."""

    def render(self, task) -> Text:
        finish = task.fields.get("finish_at")
        if finish is None:
            return Text("estimating", style="progress.remaining")
        left = finish - time.monotonic()
        return Text(f"~{clock(left)} left" if left >= 0 else f"{clock(-left)} over the estimate", style="progress.remaining")


class JobProgress:
    """The `progress(message, job)` callback of `export_model`, rendered on `console`."""

    def __init__(self, console: Console, plan: ExportPlan, workers: int, costs: JobCosts):
        self.console = console
        self.jobs = plan.jobs
        self.workers = max(1, min(workers, len(plan.jobs)))
        self.costs = costs
        self.done: set[Job] = set()
        self.working = False  # a job has started (serial) or finished (workers): the setup is behind
        self.started = time.monotonic()
        self.estimate: float | None = None
        self.live = console.is_terminal
        self._bar: Progress | None = None
        self._task = None
        self._headed = False
        self._stage: threading.Timer | None = None
        self._stages = 0  # set-up messages so far: a timer speaks only for the latest
        self._lock = threading.Lock()

    def __enter__(self) -> "JobProgress":
        self.started = time.monotonic()
        self.estimate = self._remaining()  # the whole run, as the recorded costs see it
        total = len(self.jobs)
        if self.live:
            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), _Left(), console=self.console, transient=True)
            self._bar.__enter__()
            self._task = self._bar.add_task("starting", total=total, finish_at=self._finish_at())
        return self

    def __exit__(self, *exc) -> None:
        self._quiet()
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def _quiet(self) -> None:
        with self._lock:
            if self._stage is not None:
                self._stage.cancel()
                self._stage = None

    def _print(self, line: str) -> None:
        """A piped line, after the plan's size once (with the first line printed)."""
        with self._lock:
            if not self._headed:
                self._headed = True
                self.console.print(f"{len(self.jobs)} job(s) on {self.workers} worker(s)"
                                   + (f", about {clock(self.estimate)} in all by recorded costs" if self.estimate is not None else ""),
                                   highlight=False)
            self.console.print(line, highlight=False)

    def _stage_lasted(self, message: str, stage: int) -> None:
        with self._lock:
            if self._stage is None or stage != self._stages:
                return  # a later message came first
            self._stage = None
        self._print(f"{message}  ({clock(time.monotonic() - self.started)} elapsed)")

    def _remaining(self) -> float | None:
        """Seconds of work left (divided over the workers), or None before anything is known."""
        todo = [j for j in self.jobs if j not in self.done]
        known = [c for c in (self.costs.get(j) for j in self.jobs) if c is not None]
        elapsed = time.monotonic() - self.started
        if known:
            fill = sum(known) / len(known)
        elif self.done:
            fill = elapsed * self.workers / len(self.done)
        else:
            return None
        setup = 0.0 if self.working else max(0.0, (self.costs.setup or 0.0) - elapsed)
        return setup + sum(self.costs.get(j) or fill for j in todo) / self.workers

    def _finish_at(self) -> float | None:
        left = self._remaining()
        return None if left is None else time.monotonic() + left

    def __call__(self, message: str, job: Job | None) -> None:
        finished = job is not None and message.endswith(VERDICTS)
        self.working = self.working or job is not None
        if self._bar is None:
            # Piped: the plan's size with the first line printed, so that bad input caught while
            # the model loads still prints its one `edgex:` line and nothing else.
            self._quiet()
            if job is None:
                with self._lock:
                    self._stages += 1
                    self._stage = threading.Timer(STAGE_QUIET_S, self._stage_lasted, (message, self._stages))
                    self._stage.daemon = True
                    self._stage.start()
        if finished:
            self.done.add(job)
        if self._bar is not None:
            if finished:
                self._bar.console.print(f"[{len(self.done)}/{len(self.jobs)}] {message}", highlight=False)
            self._bar.update(self._task, description=message, completed=len(self.done), finish_at=self._finish_at())
        elif finished:
            left = self._remaining()
            timing = f"{clock(time.monotonic() - self.started)} elapsed" + (f", ~{clock(left)} left" if left is not None else "")
            self._print(f"[{len(self.done)}/{len(self.jobs)}] {message}  ({timing})")
