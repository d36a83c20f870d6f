"""The export pipeline: recipe -> components -> exporters -> parity gate -> manifest.

A library function: the CLI only parses and renders, tests and programs call `export_model`.
"""

from __future__ import annotations

import gc
import json
import platform
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from functools import partial
from typing import Callable

from . import __version__
from .artifacts.across import ENV, ArtifactCache
from .artifacts.files import (
    MANIFEST, ensure_writable_dir, file_records, move_into_place, publish, staging_dir, strict_json, write_json_atomic,
)
from .artifacts.keys import tree_sha256
from .artifacts.reuse import export_key, job_keys, reusable_jobs, unchanged
from .component import Component
from .errors import EdgexError
from .exporters import EXPORTERS
from .exporters.base import Exporter
from . import host
from .isolation import ChildDied, RanHere, computing, die_with_parent, forking_supported, run_forked_for, start_forked
from .lowering_turns import turn as lowering_turn
from .hub import HUB_DIR, HubSettings, device_parity
from .hub import connect as connect_hub
from .memory_needs import Need, job_needs, refuse_oversized
from .parity.check import ParityReport, entry_gate, measure
from .parity.gates import check_overrides, lowering_db, threshold_db
from .parity.half_arithmetic import half_arithmetic_gates
from .parity.runtimes import RUNTIMES
from .parity.runtimes.base import Unsupported
from .parity.quantized import quantized_parity
from .parity.scheme import Recording, Reference, measure_split, remembered
from .parity.tensors import tensor_parity
from .plan import Job, make_plan
from .recipes import RECIPES
from .resources import JobMemory, PeakRss, return_free_memory
from .scheduler import Source, Task, run_tasks, warm_up
from .side_by_side import auto_budget_mb
from .status import check_unverified_kinds, entry_verdict, status
from .toolchain import versions

FAILED_DIR = "failed"
UNVERIFIED_DIR = "unverified"  # not verified here (nothing ran them, or a table not read back): kept apart


def _folder(root: Path, verdict: str) -> Path:
    """Where an entry's files go inside `root`: failed/, unverified/, or root (verified files only).
    Accepting unverified kinds changes the status, never where their files lie."""
    if verdict == "fail":
        return root / FAILED_DIR
    return root / UNVERIFIED_DIR if verdict == "unverified" else root


def _export_one(job: Job, component: Component, exporter: Exporter, stage: Path, overrides, threads, hub) -> list[dict]:
    """The artifact's entry, then one entry per sidecar it declares. Everything is written and
    placed inside `stage`, which mirrors the output folder (see `export_model`)."""
    work = Path(tempfile.mkdtemp(prefix=".job-", dir=stage))  # scratch: never published
    dest = work / f"{component.name}.{job.precision}{exporter.extension}"
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
        **({"coarse_scheme": job.coarse} if job.coarse else {}),
    }
    start = time.perf_counter()
    exporter.before_lowering(component, job.precision, **dict(job.options))
    result, peak_mb, waited = _lower_apart(exporter, component, job, dest)
    if waited >= 0.1:  # recorded once, and taken out of both its export and its job seconds as recorded
        entry["lowering_waited_seconds"] = round(waited, 1)
    entry.update(export_seconds=round(time.perf_counter() - start - entry.get("lowering_waited_seconds", 0.0), 3),
                 export_peak_rss_mb=peak_mb, io_float_dtype=result.io_float_dtype, details=result.details)
    if result.sidecars_not_written:
        entry["sidecars_not_written"] = dict(result.sidecars_not_written)
    gate = threshold_db(component.role, job.precision, overrides)
    entry.update(stored_parity(exporter, component, result.files, gate, job.precision, dict(job.options)))
    entry["export_options"] = dict(job.options)  # what `edgex verify` passes when it re-derives the stored scheme
    scheme = partial(exporter.scheme_reference, component, job.precision, result.files, **dict(job.options))
    device = _OnDevice(hub, dict(job.placement).get("compute_unit"), scheme) if hub is not None else None
    entries = [_gate_and_place(entry, component, result.files, exporter.runtime, None, job.precision, overrides, threads, device, stage,
                               scheme, job.coarse)]
    # The parity run's runtime and scheme reference are gone, but glibc keeps what they freed (2 GB
    # after a 0.6b talker's fp16 scheme reference): it goes back before the sidecars' checks.
    gc.collect()
    return_free_memory()
    for sidecar in result.sidecars:
        side = {**{k: entry[k] for k in ("component", "role", "exporter", "precision")},
                "format": sidecar.format, "backend": sidecar.backend, "sidecar_of": result.files[0].name,
                "runtime": sidecar.runtime, "io_float_dtype": sidecar.io_float_dtype, "details": sidecar.details,
                "export_options": dict(job.options)}
        side.update(stored_parity(exporter, component, sidecar.files, gate, job.precision, dict(job.options)))
        entries.append(_gate_and_place(side, component, sidecar.files, sidecar.runtime, sidecar.reason, job.precision,
                                       overrides, threads, device, stage))
    return entries


def stored_parity(exporter: Exporter, component: Component, files: list[Path], gate: float, precision: str, options: dict) -> dict:
    """An entry's checks of the bytes its files store, those that apply: `tensor_parity` (stored
    tensors no run reads, against the artifact's gate) and `quantized_parity` (each stored quantized
    tensor against an independent quantization of the eager weight). They see what a parity run
    cannot where the scheme reference reads its weights from the same file."""
    blocks = {}
    tensors = tensor_parity(exporter, component, files, gate, precision, options)
    if tensors is not None:
        blocks["tensor_parity"] = tensors
    quantized = quantized_parity(exporter, component, files, precision, options)
    if quantized is not None:
        blocks["quantized_parity"] = quantized
    return blocks


def gate_files(component: Component, exporter: Exporter, files: list[Path], io_float_dtype, precision: str,
               overrides: dict | None = None, threads=None, options: dict | None = None) -> dict:
    """What `edgex export` gates an exporter's files on, without placing them: the stored-tensor
    checks (`stored_parity`), the parity run (`run_parity`: `parity`, a `ParityReport`) and the
    verdict they make together (`combined_verdict`)."""
    options = dict(options or {})
    blocks = stored_parity(exporter, component, files, threshold_db(component.role, precision, overrides or {}), precision, options)
    report = run_parity(component, exporter, files, io_float_dtype, precision, overrides or {}, threads, options)
    verdict = combined_verdict(report.verdict, blocks.get("tensor_parity", {}).get("verdict"), None,
                               blocks.get("quantized_parity", {}).get("verdict"))
    return {"parity": report, **blocks, "verdict": verdict}


def _lower(exporter: Exporter, component: Component, job: Job, dest: Path):
    """The exporter's lowering, its files written to `dest`, its peak RSS, and the seconds it waited
    for its turn (`edgex.lowering_turns`)."""
    with lowering_turn(exporter.lowering_alone) as waited, PeakRss() as peak:
        result = exporter.export(component, job.precision, dest, **dict(job.options))
    return result, peak.mb, waited[0]


def _lower_apart(exporter: Exporter, component: Component, job: Job, dest: Path):
    """`_lower` in a process forked for it, so that the job's parity run starts without whatever
    the lowering left alive. Lowering does not free all it made when it returns: torch's fake-tensor
    dispatch cache is class-wide and keys on the graph's arguments, among them ExecuTorch's lowered
    delegate, which holds a copy of every weight (a 1.6 GB stack kept 1.67 GB after its `.pte` was
    written). At Spark-X2.5 1.7b that was 9.4 GB, and the prefill `.pte`'s parity run was OOM-killed
    beside it. Exporters that are not `fork_safe` lower in this process."""
    if not exporter.fork_safe:
        return _lower(exporter, component, job, dest)
    return run_forked_for(component, "the lowering's process", _lower, exporter, component, job, dest)


@dataclass(frozen=True)
class _OnDevice:
    """What a job's entries need to run on the AI Hub device: the connection, the compute unit its
    placement names, and the job's scheme reference (a sidecar is compiled from the same graph, so
    its device run is split against the same scheme)."""

    connection: object
    compute_unit: str | None
    scheme_reference: Callable | None


def _gate_and_place(entry: dict, component, files, runtime, reason, precision, overrides, threads, device: _OnDevice | None,
                    stage: Path, scheme_reference=None, coarse: str | None = None) -> dict:
    """Parity for one entry's files (in `runtime`, or method `none` with `reason`), on the AI Hub
    device with `device`, its verdict, and its files moved into their folder of the staged layout."""
    entry["parity"] = parity_in(runtime, reason, component, files, entry["io_float_dtype"], precision, overrides, threads,
                                scheme_reference, coarse).to_json()
    if device is not None:  # after local parity, under the same gates: the artifact runs on the AI Hub device
        entry["device_parity"] = device_parity(device.connection, component, files, entry["io_float_dtype"], entry["parity"], stage,
                                               device.compute_unit, device.scheme_reference, _lowering_gate(precision, overrides))
    verdict = combined_verdict(*(entry.get(k, {}).get("verdict") for k in ("parity", "tensor_parity", "device_parity",
                                                                          "quantized_parity")))
    placed = move_into_place(files, _folder(stage, verdict))
    entry["files"] = [record for p in placed for record in file_records(p, stage)]
    entry["verdict"] = entry_verdict(verdict, entry.get("coarse_scheme"))
    entry["gate"] = entry_gate(*(entry.get(k) for k in ("parity", "tensor_parity", "quantized_parity", "device_parity")))
    return entry


def _lowering_gate(precision: str, overrides) -> float | None:
    try:
        return lowering_db(precision, overrides)
    except EdgexError:  # fp32: no scheme reference to lower against
        return None


def combined_verdict(local: str, tensors: str | None = None, device: str | None = None, quantized: str | None = None) -> str:
    """One entry's verdict from its parity blocks: any failure fails it; it passes when a run of it
    passed, here or on the AI Hub device (which verifies what nothing here can run), and every
    stored tensor no run reads was read back (tensors not "unverified"), and every stored quantized
    tensor too (`quantized`, `edgex.parity.quantized`); else unverified. Stored-tensor parity alone
    never passes an artifact: it does not run it."""
    if "fail" in (local, tensors, device, quantized):
        return "fail"
    return "pass" if "pass" in (local, device) and "unverified" not in (tensors, quantized) else "unverified"


def _export_guarded(job: Job, component: Component, stage, overrides, threads, hub) -> list[dict]:
    """One artifact (+ sidecars); a lowering or runtime crash is recorded as verdict "error", never hidden.
    `job_seconds` (export + parity wall time, on the artifact's entry) is what the CLI's next estimate
    of this job uses; `job_peak_rss_mb` / `job_added_rss_mb` its process's peak resident memory and
    what the job added to what it started with (`JobMemory`)."""
    exporter = EXPORTERS.get(job.exporter)
    started = time.perf_counter()
    memory = JobMemory()
    try:
        entries = _export_one(job, component, exporter, stage, overrides, threads, hub)
    except EdgexError:
        raise
    except Exception as exc:
        entries = error_entries(job, exc)
    # its own time: not the wait for another job's compile (`lowering_waited_seconds`), so that its next
    # estimate and its place in the longest-first order do not depend on what ran beside it
    entries[0]["job_seconds"] = round(time.perf_counter() - started - entries[0].get("lowering_waited_seconds", 0.0), 3)
    entries[0].update(memory.record(entries[0].get("export_peak_rss_mb")))
    # A lowered program is a web of graph objects in reference cycles that hold the weights they
    # were made from: freed now, before the next artifact is lowered, not whenever the collector runs,
    # and the freed pages handed back to the system rather than kept in the allocator's arenas.
    gc.collect()
    return_free_memory()
    return entries


def error_entries(job: Job, exc: BaseException) -> list[dict]:
    exporter = EXPORTERS.get(job.exporter)
    message = str(exc).splitlines()[0] if str(exc) else ""
    entry = {"component": job.component, "role": job.role, "format": exporter.format, "exporter": exporter.name,
             "backend": exporter.backend, "precision": job.precision, "verdict": "error",
             "error": f"{type(exc).__name__}: {message}"[:500], "files": []}
    if isinstance(exc, ChildDied) and exc.signal:  # the job's or its lowering's process (the OOM killer)
        entry["killed_by"] = exc.signal
    return [entry]


def _start_isolated(job: Job, component: Component, *args) -> "_IsolatedJob | RanHere":
    """`_export_guarded` set going in a child process (`start_forked`): the memory the job allocates
    goes with it, and what it computed for the component comes back when its result is taken. A
    child that dies (the OOM killer) is that job's "error", and the export goes on with the next. An
    exporter that is not `fork_safe` runs its jobs here, before this returns."""
    if not EXPORTERS.get(job.exporter).fork_safe:
        return RanHere(_export_guarded, (job, component, *args))
    return _IsolatedJob(job, component, start_forked(computing, component, _export_guarded, job, component, *args,
                                                     label="the job's process"))


class _IsolatedJob:
    def __init__(self, job: Job, component: Component, forked):
        self.job, self.component, self.forked, self.started = job, component, forked, time.perf_counter()

    def result(self) -> list[dict]:
        try:
            entries, added = self.forked.result()
        except ChildDied as exc:
            entries = error_entries(self.job, exc)
            entries[0]["job_seconds"] = round(time.perf_counter() - self.started, 3)
            return entries
        self.component.adopt(added)
        return entries

    def stop(self) -> None:
        self.forked.stop()


_WORKER: dict = {}


def _worker_init(model, preset, checkpoint, seed, options, names, threads_per_worker) -> None:
    """Each worker rebuilds the (deterministic) eager model and components once. A failure is kept
    for the worker's first job to raise: an exception escaping an initializer is logged with its
    traceback by concurrent.futures and breaks the pool without a message."""
    die_with_parent()
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


def _worker_job(job: Job, args) -> list[dict]:
    if "error" in _WORKER:
        raise EdgexError(f"an export worker could not build the model: {_WORKER['error']}")
    warm_up([job])
    return _start_isolated(job, _WORKER["components"][job.component], *args).result()


def _export_parallel(plan_jobs, workers, source, args, progress) -> list[list[dict]]:
    """Each job's entries, in plan order, exported in `workers` processes (spawned: torch and fork do not mix). ExecuTorch lowering is
    single-threaded Python, so on N cores N workers cut the wall time close to N-fold."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    per_worker = max(1, (os.cpu_count() or 1) // workers)
    context = multiprocessing.get_context("spawn")
    entries: list[list[dict] | None] = [None] * len(plan_jobs)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init, initargs=(*source, per_worker)) as pool:
        futures = {pool.submit(_worker_job, job, args): i for i, job in enumerate(plan_jobs)}
        for future in as_completed(futures):
            i = futures[future]
            try:
                entries[i] = future.result()
            except BrokenProcessPool:
                raise EdgexError(f"an export worker process died (killed for memory?): rerun with fewer --jobs than {workers}") from None
            job = plan_jobs[i]
            progress(f"{job.component} {job.exporter} {job.precision}: {entries[i][0]['verdict']}", job)
    return entries


def run_parity(component, exporter, files, io_float_dtype, precision, overrides, threads, options=None,
               coarse: str | None = None) -> ParityReport:
    """Parity of an exporter's artifact, run in the exporter's runtime, with its stored scheme
    (`options`: those it was exported with; `coarse`: see `parity_in`)."""
    return parity_in(exporter.runtime, None, component, files, io_float_dtype, precision, overrides, threads,
                     partial(exporter.scheme_reference, component, precision, files, **(options or {})), coarse)


def parity_in(runtime_name: str | None, reason: str | None, component, files, io_float_dtype, precision, overrides,
              threads, scheme_reference: Callable[[], "Reference | None"] | None = None,
              coarse: str | None = None) -> ParityReport:
    """Parity of `files` run in the runtime adapter `runtime_name`; None: nothing here runs them,
    method `none` with `reason`. With `scheme_reference` (the exporter's model of what the files
    compute, `Exporter.scheme_reference`), a quantized or fp16 artifact is gated twice: its scheme
    against fp32 eager (policy gate) and its lowering against that scheme reference (tight gate);
    see `edgex.parity.scheme`. `coarse`: the recipe's reason this scheme is too coarse for the
    component, on an artifact the user asked for by name: its lowering alone decides."""
    gate = threshold_db(component.role, precision, overrides)
    if runtime_name is None:
        return ParityReport("none", None, reason=reason, threshold_db=gate)
    runtime = RUNTIMES.get(runtime_name)
    reason = runtime.unavailable_reason()
    if reason:
        return ParityReport("none", runtime.name, reason=reason, threshold_db=gate)
    try:
        # The artifact runs first, its outputs kept (`Recording`), and its runtime goes before the
        # scheme reference is built: every pass after that, a re-gate included, replays it.
        artifact = Recording(runtime.load(files, threads))
        plain = measure(component, artifact, runtime.name, io_float_dtype, gate, runtime.method, runtime.simulator)
        artifact.release()
        reference = scheme_reference() if scheme_reference is not None else None
        reference = remembered(reference) if reference is not None else None
        lowering = lowering_db(precision, overrides) if reference is not None else None

        def gated(end_to_end: float, lowering_gate: float | None) -> ParityReport:
            if reference is None:
                replayed = measure(component, artifact.replay(), runtime.name, io_float_dtype, end_to_end, runtime.method,
                                   runtime.simulator)
            else:
                replayed = measure_split(component, artifact.replay(), runtime.name, io_float_dtype, end_to_end, lowering_gate,
                                         reference, runtime.method, runtime.simulator, coarse)
            replayed.seconds += plain.seconds  # a replay's time is scoring only: the artifact ran in the first pass
            return replayed

        report = plain if reference is None else gated(gate, lowering)
        # The floor only lowers gates, so an artifact that passes the fixed ones passes under it:
        # it is measured (minutes of emulated fp16 sums on a large model) only for one that fails.
        half = half_arithmetic_gates(component, runtime, precision, overrides, gate, lowering,
                                     measure_floor=report.verdict == "fail")
        if half and half.get("floor_db") is not None:
            report = gated(half["end_to_end_gate_db"], half.get("lowering_gate_db"))
        report.half_arithmetic = half
        return report
    except Unsupported as exc:
        return ParityReport("none", runtime.name, runtime.simulator, reason=str(exc), threshold_db=gate)


@dataclass
class ExportCall:
    """One export's inputs, as `export_model` takes them (`export_models` takes several)."""

    model: str
    target: str
    out: Path
    preset: str | None = None
    checkpoint: Path | None = None
    seed: int = 0
    components: list[str] | None = None
    formats: list[str] | None = None
    precisions: list[str] | None = None
    min_db: dict[str, float] | None = None
    placements: list[str] | None = None
    calibration_size: int | None = None
    threads: int | None = None
    hub: HubSettings | None = None
    settings: dict[str, str] | None = None
    allow_unverified: list[str] | None = None
    reuse: bool = True
    reuse_jobs: bool = True
    progress: Callable[[str, Job | None], None] | None = None


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
    max_memory_mb: float | None = None,
    hub: HubSettings | None = None,
    settings: dict[str, str] | None = None,
    allow_unverified: list[str] | None = None,
    reuse: bool = True,
    reuse_jobs: bool = True,
    progress: Callable[[str, Job | None], None] | None = None,
    runner: "Runner | None" = None,
) -> dict:
    """Export, gate and record. Returns the manifest (also written to <out>/<model>/<target>/),
    with `manifest_path` and `reused` added.

    When <out>/<model>/<target>/ already holds an export of exactly these inputs with every file
    intact (`edgex.artifacts.reuse`), that manifest is returned as it stands (`reused` true): no
    model is loaded, nothing is written. `reuse=False` exports regardless (`--force`, or a caller
    that has looked already). The manifest records the export's key (`export_key`) for the next call.
    Otherwise each job whose own key matches an intact entry of the folder's manifest keeps that entry
    and its files (`reusable_jobs`, `"reused": true`) unless `reuse_jobs` is False (`--force`), and
    so does a job found in `EDGEX_ARTIFACT_CACHE` (`edgex.artifacts.across`); the model is loaded
    only when some job is left to build.

    With `hub`, every artifact that passed locally also runs on an AI Hub device (`device_parity`).
    Such an export is never reused and records no key: a device run is not reproducible here.

    An unverified entry (no runtime here ran it, or a stored table was not read back) is kept under
    `unverified/` and makes the status "incomplete" unless its kind is in `allow_unverified`
    (`sidecar`, or a format: `edgex.status`); even then a job none of whose files ran and passed
    leaves the status "incomplete". Accepted or not, its files stay under `unverified/`.

    `settings` are the recipe's build options as text (`--set KEY=VALUE`), checked before any
    model is built and recorded in the manifest so `edgex verify` rebuilds the same graphs.

    `jobs` run side by side within `max_memory_mb` (None: 85 % of the memory free), through the one
    scheduler every export shares (`edgex.scheduler`), or elsewhere with `runner` (a Ray cluster,
    `edgex.build.executors.remote_export`); `export_models` runs several exports as one."""
    call = ExportCall(model, target, Path(out), preset=preset, checkpoint=checkpoint, seed=seed, components=components,
                      formats=formats, precisions=precisions, min_db=min_db, placements=placements,
                      calibration_size=calibration_size, threads=threads, hub=hub, settings=settings,
                      allow_unverified=allow_unverified, reuse=reuse, reuse_jobs=reuse_jobs, progress=progress)
    say = progress or (lambda _msg, _job: None)
    return export_models([call], jobs=jobs, max_memory_mb=max_memory_mb, progress=lambda message: say(message, None),
                         runner=runner)[0]


# Runs jobs elsewhere (a Ray cluster: `edgex.build.executors.remote_export`): each (call, task) given,
# it calls `task.finished(entries, described)` with the job's entries, their files placed in
# `task.scratch` (the call's stage) as a job run here places them.
Runner = Callable[[list[tuple[ExportCall, Task]], Callable[[str], None]], None]


def export_models(calls: list[ExportCall], *, jobs: int = 1, max_memory_mb: float | None = None,
                  progress: Callable[[str], None] | None = None,
                  done: Callable[[int, dict], None] | None = None, runner: Runner | None = None) -> list[dict]:
    """`export_model` of each call, run as one. Every call is checked, and what it reuses looked up,
    before any model is built; then every job left, of every call, runs through `edgex.scheduler`,
    side by side, each eager model built once for all the calls whose jobs need it. Each call's
    output is its own, as `export_model` would write it alone: its manifest is written and its files
    published as soon as its last job has finished, and `done(index, manifest)` is called then (at
    once for a call reused whole). Returns the manifests in the order of `calls`.

    `progress(message)`: the models' loading and building; each call's own `progress` gets its jobs'.
    An error stops every call not yet published, as it would stop one export. `runner`: where the jobs
    run instead of here (`Runner`). Jobs that run here are refused as a whole, before any model is
    built or any folder made, when the largest needs more memory than `max_memory_mb` (None: what the
    machine has available) allows (`edgex.memory_needs`)."""
    progress = progress or (lambda _message: None)
    done = done or (lambda _index, _manifest: None)
    exports = [_Export(call) for call in calls]
    if runner is None:  # jobs that run here: the largest must fit, or nothing is built or written
        refuse_oversized([need for export in exports if export.unchanged is None for need in export.needs()], max_memory_mb)
    for export in exports:
        ensure_writable_dir(export.out_dir)
    results: list = [None] * len(calls)

    def finish(i: int) -> None:
        results[i] = exports[i].finish()
        done(i, results[i])

    try:
        for i, export in enumerate(exports):
            if export.unchanged is not None:
                results[i] = export.unchanged
                done(i, export.unchanged)
            elif not export.todo:
                export.open()
                finish(i)
        building = [i for i, export in enumerate(exports) if results[i] is None]
        for i in building:
            exports[i].open()
        spawned = (jobs > 1 and len(building) == 1 and len(exports[building[0]].todo) > 1
                   and not forking_supported())
        if runner is not None:
            runner([(exports[i].call, exports[i].task(job, lambda i=i: finish(i))) for i in building for job in exports[i].todo],
                   progress)
        elif spawned:  # no fork here: workers build their own components
            export = exports[building[0]]
            progress(f"{jobs} worker processes: building the model, then exporting")
            loaded = export.source.load()  # for the manifest's records: the workers build their own
            export.source_records = (dict(loaded.source), dict(loaded.options))
            del loaded
            made = _export_parallel(export.todo, jobs, export.worker_source(), export.job_args(), export.progress)
            export.made = dict(zip(export.todo, made))
            finish(building[0])
        elif building:
            tasks = [exports[i].task(job, lambda i=i: finish(i)) for i in building for job in exports[i].todo]
            budget = max_memory_mb if max_memory_mb is not None else auto_budget_mb()
            run_tasks(tasks, jobs, budget, progress)
    finally:
        for export in exports:
            export.close()
    return results


class _Export:
    """One call of `export_models`: its checked plan and what it reuses (`unchanged`: the manifest
    of an unchanged export, returned as it stands), its stage while its jobs run, and its manifest
    once they have (`finish`)."""

    def __init__(self, call: ExportCall):
        self.call = call
        self.progress = call.progress or (lambda _msg, _job: None)
        checked = make_plan(call.model, call.target, call.out, preset=call.preset, checkpoint=call.checkpoint,
                            components=call.components, formats=call.formats, precisions=call.precisions,
                            placements=call.placements, calibration_size=call.calibration_size, settings=call.settings)
        self.checked = checked
        check_overrides(call.min_db or {}, set(checked.recipe.components.values()))
        self.allow_unverified = check_unverified_kinds(call.allow_unverified)
        self.out_dir = checked.out_dir  # made once every call's jobs fit (`export_models`)
        self.connection = connect_hub(call.hub, checked.target) if call.hub else None  # token and device checked before any build
        self.key = None if call.hub else export_key(checked, seed=call.seed, settings=call.settings, min_db=call.min_db,
                                                    threads=call.threads, allow_unverified=self.allow_unverified)
        self.unchanged = unchanged(self.out_dir, self.key) if self.key is not None and call.reuse else None
        self.started = time.perf_counter()
        plan_jobs = checked.jobs
        self.keys = dict(zip(plan_jobs, job_keys(self.key))) if self.key is not None else {}
        self.earlier = reusable_jobs(self.out_dir, list(self.keys.values())) if self.keys and call.reuse_jobs else {}
        self.across = ArtifactCache.from_env() if self.keys and call.reuse_jobs else None
        self.cached: dict[str, tuple[dict, Path]] = {}  # job key -> (entry of the artifact cache, its folder)
        if self.across is not None and self.unchanged is None:
            for key in self.keys.values():
                if key not in self.earlier and key not in self.cached and (hit := self.across.lookup(key)) is not None:
                    self.cached[key] = hit
        self.todo = ([job for job in plan_jobs if self.keys.get(job) not in self.earlier and self.keys.get(job) not in self.cached]
                     if self.unchanged is None else [])
        if self.unchanged is None:
            for job in plan_jobs:
                if job not in self.todo:
                    key = self.keys[job]
                    where = "" if key in self.earlier else " from the artifact cache"
                    verdict = (self.earlier[key] if key in self.earlier else self.cached[key][0]["entries"])[0]["verdict"]
                    self.progress(f"{job.component} {job.exporter} {job.precision}: reused{where}, {verdict}", job)
        # the checkpoint's content as exported: `edgex verify` and `edgex pipeline` rebuild from the path
        # and refuse a folder whose content is no longer this
        checkpoint = checked.checkpoint
        self.checkpoint_sha256 = ((self.key["inputs"].get("checkpoint_sha256") if self.key else tree_sha256(checkpoint))
                                  if checkpoint else None)
        self.source = Source.of(call.model, None if checkpoint else checked.preset or checked.recipe.default_preset,
                                checkpoint, call.seed, checked.options)
        self.made: dict[Job, list[dict]] = {}
        self.source_records: tuple[dict, dict] | None = None  # the loaded model's source and options
        self._closing = ExitStack()
        self.stage: Path | None = None

    def needs(self) -> list[Need]:
        """The memory each job left to build needs, where known (`edgex.memory_needs`)."""
        return job_needs(self.call.model, self.source.preset, self.source.checkpoint, self.todo)

    def open(self) -> None:
        """The stage mirrors the output folder: artifacts, failed/, hub/. The manifest is written first
        and the staged files published after it, so a crash (a manifest that cannot be written
        included) never leaves artifacts that look valid without the manifest that vouches for them.
        Reused entries' files stay where they are."""
        self.stage = self._closing.enter_context(staging_dir(self.out_dir))
        for record, folder in self.cached.values():  # published with the jobs built here
            ArtifactCache.place(record, folder, self.stage)

    def close(self) -> None:
        self._closing.close()

    def job_args(self) -> tuple:
        return (self.stage, self.call.min_db, self.call.threads, self.connection)

    def worker_source(self) -> tuple:
        names = list(dict.fromkeys(j.component for j in self.todo))
        return (self.call.model, self.call.preset, self.checked.checkpoint, self.call.seed, self.checked.options, names)

    def task(self, job: Job, last: Callable[[], None]) -> Task:
        """The job as the scheduler runs it; `last()` once it is this call's last to finish."""

        def finished(entries: list[dict], described: tuple[dict, dict] | None) -> None:
            self.made[job] = entries
            self.source_records = described or self.source_records
            self.progress(f"{job.component} {job.exporter} {job.precision}: {entries[0]['verdict']}", job)
            if len(self.made) == len(self.todo):
                last()

        return Task(self.source, job, lambda component: _start_isolated(job, component, *self.job_args()), self.stage,
                    started=lambda: self.progress(f"{job.component} -> {job.exporter} {job.precision}", job),
                    finished=finished)

    def finish(self) -> dict:
        """The manifest written, then the staged files published; the stage removed."""
        call = self.call
        if self.made:
            if self.source_records is None:  # no job that ran elsewhere built the model: its records from here
                loaded = self.source.load()
                self.source_records = (dict(loaded.source), dict(loaded.options))
            recorded, model_options = self.source_records
            if self.checkpoint_sha256:
                recorded = {**recorded, "checkpoint_sha256": self.checkpoint_sha256}
            source = _described(recorded)
        elif self.cached:  # every job reused, some from the artifact cache: the model it recorded (same key inputs)
            record = next(iter(self.cached.values()))[0]
            source, model_options = record["source"], record["options"]
        else:  # every job reused: the earlier export's model, whose key inputs are these
            source, model_options = earlier_model(self.out_dir)
        entries = []
        for job in self.checked.jobs:
            if job in self.made:
                entries += [{**entry, **({"job_key": self.keys[job]} if job in self.keys else {})} for entry in self.made[job]]
            elif self.keys[job] in self.earlier:
                entries += [{**entry, "reused": True} for entry in self.earlier[self.keys[job]]]
            else:
                entries += [{**entry, "reused": True, "reused_from": ENV} for entry in self.cached[self.keys[job]][0]["entries"]]
        manifest = _manifest(call.model, source, model_options, call.settings, self.checked.target, call.threads,
                             call.min_db, self.connection, entries, self.started, self.allow_unverified, self.key)
        try:
            write_json_atomic(self.out_dir / MANIFEST, manifest)
        except OSError as exc:  # a full disk or a folder gone read-only: nothing was published
            self.close()
            raise EdgexError(f"cannot write the manifest to {self.out_dir}: {exc.strerror or exc}; the export stopped and "
                             "removed its temporary files (the folder's published files are unchanged)") from None
        publish(self.stage, self.out_dir, containers=(FAILED_DIR, UNVERIFIED_DIR, HUB_DIR))
        self.close()
        if self.across is not None:
            for job, made in self.made.items():
                self.across.add(self.keys[job], [{**e, "job_key": self.keys[job]} for e in made], self.out_dir, source, model_options)
        return {**manifest, "manifest_path": str(self.out_dir / MANIFEST), "reused": False}


# What a preset's weights are, in the manifest beside its name: nobody should ship them by mistake.
PRESET_WEIGHTS = "seeded random"


def _described(source: dict) -> dict:
    """The weights' source as recorded: a preset says its weights are seeded random ones."""
    return {**source, "weights": PRESET_WEIGHTS} if "preset" in source else dict(source)


def earlier_model(folder: Path) -> tuple[dict, dict]:
    """The weights' source and model options the folder's manifest records (an export every job of
    which is reused has the same key inputs, so the same model)."""
    manifest = json.loads((folder / MANIFEST).read_text())
    return manifest["source"], manifest["options"]


def _manifest(model, source, model_options, settings, tgt, threads, min_db, connection, entries, started, allow_unverified,
              key) -> dict:
    """The manifest as written: strict JSON (non-finite figures as strings, `strict_json`)."""
    return strict_json({
        "edgex_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "host": {"python": platform.python_version(), "machine": platform.machine(), "system": platform.system(),
                 "cpu_features": host.cpu_features()},
        "tool_versions": versions(),
        "model": model,
        "source": source,
        "settings": settings or {},
        "options": model_options,
        "target": tgt.name,
        "target_facts": tgt.facts,
        "threads": threads,
        "gate_overrides": min_db or {},
        "hub": connection.to_json() if connection else None,
        "artifacts": entries,
        "allow_unverified": allow_unverified,
        "status": status(entries, allow_unverified),
        "seconds": round(time.perf_counter() - started, 3),
        "export_key": key,
    })
