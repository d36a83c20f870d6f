"""`edgex build FILE` and `edgex build merge DIRS`: run a build's jobs through the cache, then
publish one output tree with per-folder manifests, a merged `build.json` and the CI reports.

Each job is one artifact: what one `export_model` call restricted to its component, format and
precision writes, into a temporary cache folder. Why one call per artifact and not one per group of
artifacts: an artifact must be a function of its cache key alone, so its manifest entry, verdict
and files must not depend on its neighbours in the build; and `export_model` is the public contract
of what an export produces (files, manifest entries and their folders, verdicts, sidecars), so
calling it inherits every change to that contract. The calls run as one (`edgex.export.export_models`
through `edgex.scheduler`): the eager model and each component are built once for every job that
needs them, and the jobs run side by side, as `edgex export` runs its own. That relies on a recipe's
samples not depending on which other components are derived with them (a recipe's builder runs the
same seeded eager pipeline whichever components are asked for; `tests/test_spark.py` holds one
recipe to it, and `benchmarks/bench_build_vs_export.py` compares a build's sha256 with an export's).

What is published and how: `publish.py`.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable

from .. import __version__
from ..artifacts.keys import tree_sha256, weights_inputs
from ..artifacts.lock import output_lock
from ..errors import EdgexError
from .cache import Cache, files_root
from .commit import job_key_inputs
from .executors import LocalExecutor, Pending
from .publish import DISK_ERRNOS, PER_CALL, Outcome, disk_error, publish, sweep
from .reproducible import reproducibility
from .shard import partition, recorded_costs
from .spec import BuildJob, load_plan

DEFAULT_CACHE = ".edgex-cache"


def run_build(file: Path, out: Path, cache_dir: Path | None = None, shard: tuple[int, int] | None = None,
              costs: Path | None = None, progress: Callable[[str], None] | None = None, executor=None) -> dict:
    """Run (this shard of) a build file; returns build.json's content. `executor`: where the jobs
    the cache does not hold run (`edgex.build.executors`; default: here, side by side)."""
    progress = progress or (lambda _msg: None)
    started = time.perf_counter()
    plan = load_plan(file)
    mine = plan.jobs
    if shard:
        mine = partition(plan.jobs, shard[1], recorded_costs(costs))[shard[0] - 1]
    try:
        with output_lock(out) as out:
            cache = Cache(cache_dir or out / DEFAULT_CACHE)
            cache.sweep()
            sweep(out)
            outcomes = run_jobs(mine, cache, progress, executor)
            build = {"edgex_version": __version__, "file": str(plan.file), "file_sha256": plan.file_sha256,
                     "plan_sha256": plan.digest, "plan_ids": [j.id for j in plan.jobs], "jobs": len(mine),
                     "allow_unverified": list(plan.allow_unverified),
                     "shard": {"index": shard[0], "count": shard[1], "ids": [j.id for j in mine]} if shard else None,
                     "cache": str(cache.root)}
            return publish(out, outcomes, build, started)
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:
            raise disk_error(exc, out) from None
        raise


def run_jobs(jobs: list[BuildJob], cache: Cache, progress, executor=None) -> list[Outcome]:
    """Each job's outcome, in plan order. A cache hit is read here and never leaves this process;
    the other jobs are exported by `executor` (`edgex.build.executors`: side by side in this process
    by default, or on a Ray cluster) and committed to the cache here by `settle`, whichever ran
    them."""
    weights = {(j.model, j.preset, j.checkpoint): weights_inputs(j.model, j.preset, Path(j.checkpoint) if j.checkpoint else None)
               for j in jobs}  # each checkpoint hashed once
    checkpoints = {c: w["checkpoint_sha256"] for (_, _, c), w in weights.items() if c}
    last_use = {j.checkpoint: i for i, j in enumerate(jobs) if j.checkpoint}
    fresh: dict[str, list[str]] = {}
    looked = []
    for job in jobs:
        start = time.perf_counter()
        inputs = job_key_inputs(cache, job, weights[job.model, job.preset, job.checkpoint])
        key = cache.key(inputs)
        looked.append((inputs, key, cache.lookup(key), round(time.perf_counter() - start, 3)))
    todo = [Pending(i, job, looked[i][1], looked[i][0]) for i, job in enumerate(jobs) if looked[i][2] is None]
    outcomes = []
    with (executor or LocalExecutor()).exports(todo, cache, progress, len(jobs)) as exports:
        for i, job in enumerate(jobs):
            tag = f"[{i + 1}/{len(jobs)}] {job.id}"
            inputs, key, manifest, seconds = looked[i]
            reused = manifest is not None
            if reused:
                root, record = files_root(cache.path(key)), json.loads(cache.path(key).joinpath("key.json").read_text())
                export_seconds = record["export_seconds"]
            else:
                manifest, root, export_seconds, seconds = exports.result(i, lambda m: progress(f"{tag}: {m}"))
                if root is not None and job.checkpoint:
                    fresh.setdefault(job.checkpoint, []).append(key)
            if job.checkpoint and last_use[job.checkpoint] == i:
                _check_unchanged(job.checkpoint, checkpoints[job.checkpoint], cache, fresh.get(job.checkpoint, []))
            header = {k: v for k, v in manifest.items() if k not in PER_CALL}
            entries = []
            for entry in manifest["artifacts"]:
                entries.append({"id": job.id, "folder": job.folder, **entry, "build": {
                    "key": key, "reused": reused, "seconds": seconds, "export_seconds": export_seconds, "entry": job.entry,
                    "gate_overrides": dict(job.min_db), "reproducible": reproducibility(entry["exporter"]),
                }})
            outcomes.append(Outcome(job.id, job.folder, header, entries, root))
            verdicts = ", ".join(e["verdict"] for e in entries)
            progress(f"{tag}: {'reused' if reused else 'exported'} ({verdicts}, {seconds:.1f} s)")
    return outcomes


def _check_unchanged(checkpoint: str, before: str, cache: Cache, fresh_keys: list[str]) -> None:
    """A checkpoint rewritten while the build read it gives artifacts of unknown weights: they are
    dropped from the cache and the build stops before publishing anything."""
    after = tree_sha256(Path(checkpoint))
    if after != before:
        for key in fresh_keys:
            cache.discard(key)
        raise EdgexError(f"checkpoint {checkpoint} changed during the build (content sha256 {before[:12]} before, "
                         f"{after[:12]} after); its {len(fresh_keys)} new artifact(s) were discarded, nothing was "
                         "published: rerun once the checkpoint is stable")
