"""The export pipeline: recipe -> components -> exporters -> parity gate -> manifest.

A library function: the CLI only parses and renders, tests and programs call `export_model`.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from . import __version__
from .artifacts.files import ensure_writable_dir, file_records, move_into_place, staging_dir, write_json_atomic
from .component import Component
from .errors import EdgexError
from .exporters import EXPORTERS
from .exporters.base import Exporter
from .hub import HubSettings, device_parity
from .hub import connect as connect_hub
from .parity.check import ParityReport, measure
from .parity.gates import check_overrides, lowering_db, threshold_db
from .parity.runtimes import RUNTIMES
from .parity.runtimes.base import Unsupported
from .parity.scheme import build as build_scheme
from .parity.scheme import measure_split
from .precision import get_precision
from .recipes import RECIPES
from .resources import PeakRss
from .targets import get_target, parse_placement
from .toolchain import versions

MANIFEST = "manifest.json"
FAILED_DIR = "failed"
UNVERIFIED_DIR = "unverified"  # nothing could run them (method `none`): kept apart unless allowed


@dataclass(frozen=True)
class Job:
    component: str
    role: str
    exporter: str
    precision: str
    options: tuple = ()  # (key, value) pairs passed to the exporter as keyword arguments
    placement: tuple = ()  # (key, value) pairs: where it runs on the device, what parity here misses


def _job(name: str, role: str, target, placement, precision: str, calibration_size: int | None) -> Job:
    options = dict(target.exporter_options.get(placement.exporter, {}))
    if get_precision(precision).calibration and calibration_size:
        options["calibration_size"] = calibration_size
    return Job(name, role, placement.exporter, precision, tuple(options.items()), tuple(placement.to_json().items()))


def plan(recipe, target, components: list[str] | None, formats: list[str] | None, precisions: list[str] | None,
         calibration_size: int | None = None) -> list[Job]:
    """Every (component, exporter, precision) the target places, filtered by the user's choices.

    Unknown names fail here, before any model is built."""
    for p in precisions or []:
        get_precision(p)
    for f in formats or []:
        EXPORTERS.get(f)
    roles = recipe.component_names()
    for c in components or []:
        if c not in roles:
            raise EdgexError(f"no such component {c!r} in {recipe.name} (known: {', '.join(roles)})")
    jobs = []
    for name in components or list(roles):
        for placement in target.placements_for(roles[name]):
            if formats and placement.exporter not in formats:
                continue
            exporter = EXPORTERS.get(placement.exporter)
            for p in precisions or placement.precisions:
                if p in exporter.precisions:
                    jobs.append(_job(name, roles[name], target, placement, p, calibration_size))
    placed = sorted({pl.exporter for r in roles.values() for pl in target.placements_for(r)})
    if formats and not set(formats) & set(placed):
        raise EdgexError(f"target {target.name} places none of {', '.join(formats)} (it places: {', '.join(placed)})")
    for p in precisions or []:
        if not any(j.precision == p for j in jobs):
            offered = sorted({pl.exporter for r in roles.values() for pl in target.placements_for(r) if not formats or pl.exporter in formats})
            raise EdgexError(f"precision {p!r} is not supported by {', '.join(offered) or 'any format'} on target {target.name}")
    if not jobs:
        raise EdgexError(f"nothing to export: target {target.name} places none of {', '.join(formats or [])}")
    return jobs


def status(entries: list[dict], allow_unverified: bool) -> str:
    """"fail" if any artifact failed or errored; "incomplete" if one could not be verified and
    that was not allowed; else "pass". Unverified is never a pass unless the user says so."""
    verdicts = {e["verdict"] for e in entries}
    if verdicts & {"fail", "error"}:
        return "fail"
    return "incomplete" if "unverified" in verdicts and not allow_unverified else "pass"


def _folder(out_dir: Path, verdict: str, allow_unverified: bool) -> Path:
    if verdict == "fail":
        return out_dir / FAILED_DIR
    return out_dir / UNVERIFIED_DIR if verdict == "unverified" and not allow_unverified else out_dir


def _export_one(job: Job, component: Component, exporter: Exporter, stage: Path, out_dir: Path, overrides, threads, hub,
                allow_unverified) -> dict:
    dest = stage / f"{component.name}.{job.precision}{exporter.extension}"
    entry = {
        "component": component.name,
        "role": component.role,
        "format": exporter.format,
        "exporter": exporter.name,
        "backend": exporter.backend,
        "precision": job.precision,
        "inputs": [s.to_json() for s in component.inputs],
        "outputs": [s.to_json() for s in component.outputs],
        "metadata": component.metadata,
        **({"placement": dict(job.placement)} if job.placement else {}),
        "export_options": dict(job.options),  # what `edgex verify` passes when it re-derives the scheme
    }
    start = time.perf_counter()
    with PeakRss() as peak:
        result = exporter.export(component, job.precision, dest, **dict(job.options))
    entry.update(export_seconds=round(time.perf_counter() - start, 3), export_peak_rss_mb=peak.mb, io_float_dtype=result.io_float_dtype, details=result.details)
    entry["parity"] = run_parity(component, exporter, result.files, result.io_float_dtype, job.precision, overrides, threads,
                                 dict(job.options)).to_json()
    verdict = entry["parity"]["verdict"]
    if hub is not None:  # after local parity, under the same gate: the artifact runs on the AI Hub device
        entry["device_parity"] = device_parity(hub, component, result.files, result.io_float_dtype, entry["parity"], out_dir)
        device = entry["device_parity"]["verdict"]
        verdict = "fail" if device == "fail" else ("pass" if device == "pass" and verdict == "unverified" else verdict)
    placed = move_into_place(result.files, _folder(out_dir, verdict, allow_unverified))
    entry["files"] = [record for p in placed for record in file_records(p, out_dir)]
    entry["verdict"] = verdict
    return entry


def _export_guarded(job: Job, component: Component, stage, out_dir, overrides, threads, hub, allow_unverified) -> dict:
    """One artifact; a lowering or runtime crash is recorded as verdict "error", never hidden."""
    exporter = EXPORTERS.get(job.exporter)
    try:
        return _export_one(job, component, exporter, stage, out_dir, overrides, threads, hub, allow_unverified)
    except EdgexError:
        raise
    except Exception as exc:
        message = str(exc).splitlines()[0] if str(exc) else ""
        return {"component": job.component, "role": job.role, "format": exporter.format, "exporter": exporter.name,
                "backend": exporter.backend, "precision": job.precision, "verdict": "error",
                "error": f"{type(exc).__name__}: {message}"[:500], "files": []}


_WORKER: dict = {}


def _worker_init(model, preset, checkpoint, seed, options, names, threads_per_worker) -> None:
    """Each worker rebuilds the (deterministic) eager model and components once. A failure is kept
    for the worker's first job to raise: an exception escaping an initializer is logged with its
    traceback by concurrent.futures and breaks the pool without a message."""
    import torch

    from .logs import quiet_libraries

    quiet_libraries()
    torch.set_num_threads(threads_per_worker)
    try:
        recipe = RECIPES.get(model)
        loaded = recipe.load(preset, checkpoint, seed, options)
        _WORKER["components"] = {c.name: c for c in recipe.components(loaded, names)}
    except Exception as exc:  # noqa: BLE001 - reported by _worker_job as a one-line error
        _WORKER["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def _worker_job(job: Job, args) -> dict:
    if "error" in _WORKER:
        raise EdgexError(f"an export worker could not build the model: {_WORKER['error']}")
    return _export_guarded(job, _WORKER["components"][job.component], *args)


def _export_parallel(plan_jobs, workers, source, args, progress) -> list[dict]:
    """Export in `workers` processes (spawned: torch and fork do not mix). ExecuTorch lowering is
    single-threaded Python, so on N cores N workers cut the wall time close to N-fold."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    per_worker = max(1, (os.cpu_count() or 1) // workers)
    context = multiprocessing.get_context("spawn")
    entries: list[dict | None] = [None] * len(plan_jobs)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init, initargs=(*source, per_worker)) as pool:
        futures = {pool.submit(_worker_job, job, args): i for i, job in enumerate(plan_jobs)}
        for future in as_completed(futures):
            i = futures[future]
            try:
                entries[i] = future.result()
            except BrokenProcessPool:
                raise EdgexError(f"an export worker process died (killed for memory?): rerun with fewer --jobs than {workers}") from None
            job = plan_jobs[i]
            progress(f"{job.component} {job.exporter} {job.precision}: {entries[i]['verdict']}", job)
    return entries


def run_parity(component, exporter, files, io_float_dtype, precision, overrides, threads, options=None) -> ParityReport:
    """Run the artifact and gate it. A quantized artifact whose exporter can say what its file
    stores (`Exporter.stored_scheme`, given the export's `options`) is gated twice: its scheme
    against fp32 eager (policy gate) and its lowering against the eager model running that scheme
    (tight gate); see `edgex.parity.scheme`."""
    runtime = RUNTIMES.get(exporter.runtime)
    gate = threshold_db(component.role, precision, overrides)
    reason = runtime.unavailable_reason()
    if reason:
        return ParityReport("none", runtime.name, reason=reason, threshold_db=gate)
    try:
        session = runtime.load(files, threads)
        scheme = exporter.stored_scheme(component, precision, files, **(options or {}))
        if scheme is None:
            return measure(component, session, runtime.name, io_float_dtype, gate, runtime.method, runtime.simulator)
        return measure_split(component, session, runtime.name, io_float_dtype, gate, lowering_db(precision, overrides),
                             build_scheme(component, scheme), runtime.method, runtime.simulator)
    except Unsupported as exc:
        return ParityReport("none", runtime.name, runtime.simulator, reason=str(exc), threshold_db=gate)


def _placement_overrides(recipe, placements: list[str]) -> dict:
    overrides = dict(parse_placement(p) for p in placements)
    roles = sorted(set(recipe.component_names().values()))
    for role, placement in overrides.items():
        if role not in roles:
            raise EdgexError(f"no role {role!r} in {recipe.name} (roles: {', '.join(roles)})")
        get_precision(placement.precisions[0])
        EXPORTERS.get(placement.exporter).check(placement.precisions[0])
    return overrides


def export_model(
    model: str,
    target: str,
    out: Path,
    *,
    preset: str | None = None,
    checkpoint: Path | None = None,
    seed: int = 0,
    components: list[str] | None = None,
    formats: list[str] | None = None,
    precisions: list[str] | None = None,
    min_db: dict[str, float] | None = None,
    placements: list[str] | None = None,
    calibration_size: int | None = None,
    threads: int | None = None,
    jobs: int = 1,
    hub: HubSettings | None = None,
    settings: dict[str, str] | None = None,
    allow_unverified: bool = False,
    progress: Callable[[str, Job | None], None] | None = None,
) -> dict:
    """Export, gate and record. Returns the manifest (also written to <out>/<model>/<target>/).

    With `hub`, every artifact that passed locally also runs on an AI Hub device (`device_parity`).

    An artifact no runtime here could run (parity method `none`) makes the status "incomplete" and
    is kept under `unverified/`, unless `allow_unverified`: then it sits beside the passing ones,
    keeps its verdict "unverified", and the status can be "pass".

    `settings` are the recipe's build options as text (`--set KEY=VALUE`), checked before any
    model is built and recorded in the manifest so `edgex verify` rebuilds the same graphs."""
    progress = progress or (lambda _msg, _job: None)
    recipe = RECIPES.get(model)
    tgt = get_target(target)
    if placements:
        tgt = tgt.with_overrides(_placement_overrides(recipe, placements))
    if preset and checkpoint:
        raise EdgexError("give either --preset or --checkpoint, not both")
    if preset and preset not in recipe.presets():
        raise EdgexError(f"no such preset {preset!r} for {model} (known: {', '.join(recipe.presets())})")
    if calibration_size is not None and calibration_size < 1:
        raise EdgexError(f"--calibration must be at least 1, got {calibration_size}")
    options = recipe.parse_options(settings)
    check_overrides(min_db or {}, set(recipe.component_names().values()))
    plan_jobs = plan(recipe, tgt, components, formats, precisions, calibration_size)
    for job in plan_jobs:
        EXPORTERS.get(job.exporter).check(job.precision)
    out_dir = ensure_writable_dir(Path(out) / model / target)
    connection = connect_hub(hub, tgt) if hub else None  # token and device checked before any build

    started = time.perf_counter()
    progress("loading model", None)
    loaded = recipe.load(preset, checkpoint, seed, options)
    names = list(dict.fromkeys(j.component for j in plan_jobs))
    parallel = jobs > 1 and len(plan_jobs) > 1

    with staging_dir(out_dir) as stage:
        args = (stage, out_dir, min_db, threads, connection, allow_unverified)
        if parallel:  # workers build their own components
            entries = _export_parallel(plan_jobs, jobs, (model, preset, checkpoint, seed, options, names), args, progress)
        else:
            progress("building components from the eager pipeline", None)
            built = {c.name: c for c in recipe.components(loaded, names)}
            entries = []
            for job in plan_jobs:
                progress(f"{job.component} -> {job.exporter} {job.precision}", job)
                entries.append(_export_guarded(job, built[job.component], *args))
                progress(f"{job.component} {job.exporter} {job.precision}: {entries[-1]['verdict']}", job)

    manifest = {
        "edgex_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": {"python": platform.python_version(), "machine": platform.machine(), "system": platform.system()},
        "tool_versions": versions(),
        "model": model,
        "source": loaded.source,
        "settings": settings or {},
        "options": loaded.options,
        "target": tgt.name,
        "target_facts": tgt.facts,
        "threads": threads,
        "gate_overrides": min_db or {},
        "hub": connection.to_json() if connection else None,
        "artifacts": entries,
        "allow_unverified": allow_unverified,
        "status": status(entries, allow_unverified),
        "seconds": round(time.perf_counter() - started, 3),
    }
    write_json_atomic(out_dir / MANIFEST, manifest)
    manifest["manifest_path"] = str(out_dir / MANIFEST)
    return manifest
