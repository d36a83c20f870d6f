"""One build job outside the driver's bookkeeping: its cache key inputs, its one `export_model` call
into a staging folder (many jobs' calls run as one: `export_jobs`), and the commit of that folder into
the cache (`settle`), the one path by which anything enters the cache. The local and Ray executors
and the Ray worker's child process share it.
"""

from __future__ import annotations

import builtins
import shutil
from pathlib import Path
from typing import Callable

from ..errors import EdgexError
from ..export import ExportCall, export_models
from .cache import Cache, files_root
from .spec import BuildJob


def _io_failure(error: str) -> bool:
    """An export recorded as verdict "error" by an OSError (its text starts with the type's name):
    the machine failed to read or write (a full disk, a quota, a read-only or vanished folder; numpy
    reports a full disk as "OSError: problem writing element N to file", without errno), which says
    nothing about the artifact and would fail every later job the same way: the build stops."""
    cls = getattr(builtins, error.partition(":")[0], None)
    return isinstance(cls, type) and issubclass(cls, OSError)


def job_key_inputs(cache: Cache, job: BuildJob, weights: dict) -> dict:
    """What the job's cache key is the digest of. A Ray worker computes it again before exporting:
    the same key there means the same edgex, toolchain and weights as here."""
    return cache.key_inputs(job, weights)


def export_call(job: BuildJob, dest: Path, progress: Callable[[str], None]) -> ExportCall:
    """The job's `export_model` call, into `dest` (files under `<dest>/<model>/<target>/`)."""
    return ExportCall(
        job.model, job.target, dest, preset=job.preset, checkpoint=Path(job.checkpoint) if job.checkpoint else None,
        seed=job.seed, components=[job.component], formats=[job.exporter], precisions=[job.precision],
        min_db=dict(job.min_db), placements=list(job.placements), calibration_size=job.calibration,
        threads=job.threads, settings=dict(job.settings), progress=lambda message, _job: progress(message),
    )


def export_jobs(jobs: list[tuple[BuildJob, Path]], progress: Callable[[str], None], done: Callable[[int, dict, float], None],
                workers: int | None = None, max_memory_mb: float | None = None) -> None:
    """Each (job, dest) exported as its own `export_model` call would, all of them as one
    (`export_models`): side by side, each eager model built once for every job that needs it.
    `done(index, manifest, seconds)` as each job finishes (`seconds`: the job's own, export and
    parity); `progress(message)` for the models, each job's own messages prefixed by its id."""
    from ..side_by_side import default_jobs

    def tagged(job: BuildJob) -> Callable[[str], None]:
        return lambda message: progress(f"{job.id}: {message}")

    def finished(index: int, manifest: dict) -> None:
        done(index, bare(manifest), job_seconds(manifest))

    export_models([export_call(job, dest, tagged(job)) for job, dest in jobs], jobs=workers or default_jobs(),
                  max_memory_mb=max_memory_mb, progress=progress, done=finished)


def export_job(job: BuildJob, dest: Path, progress) -> dict:
    """The job's one `export_model` call into `dest` (files under `<dest>/<model>/<target>/`); its manifest."""
    return bare(export_models([export_call(job, dest, progress)])[0])


def bare(manifest: dict) -> dict:
    """A manifest as the cache keeps it: without what describes the call that returned it."""
    return {k: v for k, v in manifest.items() if k not in ("manifest_path", "reused")}


def job_seconds(manifest: dict) -> float:
    """What a one-job export's job took (export and parity), as the job measured it."""
    return round(sum(a.get("job_seconds", 0.0) for a in manifest["artifacts"]), 3)


def settle(job: BuildJob, cache: Cache, key: str, inputs: dict, staged: Path, manifest: dict,
           export_seconds: float) -> Path | None:
    """A finished export in `staged` (a cache staging folder) committed under its key; the entry's
    files root, or None when it errored (an error may be transient: it is reported, never cached).
    A write failure stops the build."""
    errors = [a.get("error", "") for a in manifest["artifacts"] if a["verdict"] == "error"]
    failure = next((e for e in errors if _io_failure(e)), None)
    if failure:
        free = shutil.disk_usage(cache.root).free
        raise EdgexError(f"{job.id}: writing the export failed ({failure}; {free / 1e6:.1f} MB free under {cache.root}); "
                         "the build stopped and removed its temporary files (published files are unchanged)")
    if errors:
        shutil.rmtree(staged, ignore_errors=True)
        return None
    return files_root(cache.commit(staged, key, inputs, {"id": job.id, "export_seconds": export_seconds}))
