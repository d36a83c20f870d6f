"""`edgex export --executor ray`: an export's jobs on a Ray cluster, its manifest written here.

Each job of the export is the build job its `export_model` call restricted to it would be
(`BuildJob`, whose cache key is the export's own key for the job), run through a build's Ray
executor (`RayExecutor`: one task per model per node, each building the eager model once and running
its jobs side by side) into a build cache of its own, a hidden folder in the export's stage. Each
job's files are then moved into the stage where a job run here would have placed them (the entries'
paths are relative to the export folder in both), and the export publishes the folder with one
manifest as it always does.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from ...errors import EdgexError
from ...export import ExportCall
from ...scheduler import Task
from ..cache import Cache
from ..run import run_jobs
from ..spec import BuildJob
from . import EXECUTORS
from .ray_cluster import RayExecutor

BUILD_ONLY = ("id", "folder", "build")  # what a build adds to an export's entry


def build_job(call: ExportCall, task: Task) -> BuildJob:
    job, source = task.job, task.source
    return BuildJob(0, call.model, call.model, source.preset, source.checkpoint, call.seed,
                    tuple(sorted((call.settings or {}).items())), call.target, tuple(call.placements or ()),
                    tuple(sorted((call.min_db or {}).items())), call.calibration_size, call.threads, job.component, job.role,
                    job.exporter, job.precision, job.options, job.placement)


def ray_runner(address: str | None, executor: RayExecutor | None = None) -> Callable:
    """An `edgex.export.Runner` that runs the jobs on the Ray cluster at `address` (None: embedded)."""

    def run(work: list[tuple[ExportCall, Task]], progress: Callable[[str], None]) -> None:
        if not work:
            return
        root = Path(tempfile.mkdtemp(prefix=".ray-", dir=work[0][1].scratch))
        try:
            jobs = [build_job(call, task) for call, task in work]
            outcomes = run_jobs(jobs, Cache(root), progress, executor or RayExecutor(address))
            for (_, task), outcome in zip(work, outcomes):
                entries = [{k: v for k, v in entry.items() if k not in BUILD_ONLY} for entry in outcome.artifacts]
                for entry in entries:
                    for record in entry.get("files", []):
                        dest = task.scratch / record["path"]
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        os.replace(outcome.root / record["path"], dest)
                header = outcome.header
                task.finished(entries, (header["source"], header["options"]) if "source" in header else None)
        finally:
            shutil.rmtree(root, ignore_errors=True)

    return run


def export_runner(name: str, address: str | None = None, hub: bool = False):
    """Where `edgex export --executor NAME [--address ADDRESS]` runs its jobs: None for here, else an
    `edgex.export.Runner`; bad input is a one-line error."""
    if name not in EXECUTORS:
        raise EdgexError(f"unknown --executor {name!r} (known: {', '.join(EXECUTORS)})")
    if name == "local":
        if address:
            raise EdgexError("--address names a Ray cluster: give it with --executor ray")
        return None
    if hub:
        raise EdgexError("--hub runs each artifact on an AI Hub device from this machine: give it with --executor local")
    return ray_runner(address)
