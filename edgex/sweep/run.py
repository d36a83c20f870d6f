"""The sweep's run through the build cache, and one row per artifact read back from the published
manifests (figures as the gates reported them, bytes, export seconds, latency here)."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable

from ..artifacts.lock import output_lock
from ..build.cache import Cache
from ..build.publish import publish
from ..build.publish import sweep as sweep_staging
from ..build.run import DEFAULT_CACHE, run_jobs
from ..build.spec import BuildJob

LATENCY_RUNS = 5


def run_sweep(jobs: list[BuildJob], out: Path, cache_dir: Path | None = None, threads: int | None = None,
              progress: Callable[[str], None] | None = None, allow_unverified: tuple[str, ...] = (),
              executor=None) -> dict:
    """Run the jobs through the build cache, publish them as a build (manifests that `edgex verify`
    and `edgex pipeline` read), and return the build data plus one row per artifact. The published
    status follows `edgex.status` with the kinds accepted by name (`allow_unverified`), as a build's. `executor`:
    where the uncached jobs run (`edgex.build.executors`; default: here, side by side)."""
    progress = progress or (lambda _m: None)
    started = time.perf_counter()
    with output_lock(out) as out:
        cache = Cache(cache_dir or out / DEFAULT_CACHE)
        cache.sweep()
        sweep_staging(out)
        outcomes = run_jobs(jobs, cache, progress, executor)
        build = {"file": None, "jobs": len(jobs), "allow_unverified": list(allow_unverified), "shard": None, "cache": str(cache.root)}
        data = publish(out, outcomes, build, started)
    progress("timing the artifacts this machine runs")
    data["rows"] = [_row(a, out, threads) for a in data["artifacts"] if "sidecar_of" not in a]
    return data


def _row(artifact: dict, out: Path, threads: int | None) -> dict:
    parity = artifact.get("parity") or {}
    split = {k: parity.get(k) or {} for k in ("scheme", "lowering")}
    options = artifact.get("export_options") or {}
    calibration = options.get("calibration_size") or (artifact.get("details") or {}).get("calibration_sets")
    files = [out / artifact["folder"] / f["path"] for f in artifact.get("files", [])]
    row = {
        "component": artifact["component"], "role": artifact["role"], "format": artifact["format"], "folder": artifact["folder"],
        "exporter": artifact["exporter"], "precision": artifact["precision"], "calibration": calibration,
        "min_snr_db": parity.get("min_snr_db"), "gate_db": parity.get("threshold_db"),
        "scheme_db": split["scheme"].get("min_snr_db"), "scheme_gate_db": split["scheme"].get("threshold_db"),
        "lowering_db": split["lowering"].get("min_snr_db"), "lowering_gate_db": split["lowering"].get("threshold_db"),
        "verdict": artifact["verdict"], "coarse_scheme": artifact.get("coarse_scheme"), "failures": parity.get("failures") or ([artifact["error"]] if "error" in artifact else []),
        "bytes": sum(f["bytes"] for f in artifact.get("files", [])), "export_s": artifact["build"]["export_seconds"],
        "reused": artifact["build"]["reused"], "method": parity.get("method"), "files": [str(f) for f in files],
        "explicit_calibration": "calibration_size" in options,
    }
    row.update(_latency(artifact, files, threads))
    return row


def _latency(artifact: dict, files: list[Path], threads: int | None) -> dict:
    """Median ms of the artifact's own runtime on inputs of its declared shapes (zeros: a valid
    position, token and code everywhere; the graphs' cost does not depend on the values), only where
    it ran here for real: a simulator's time (QNN HTP on x86) says nothing about the device."""
    from ..exporters import EXPORTERS
    from ..parity.runtimes import RUNTIMES

    parity = artifact.get("parity") or {}
    if artifact["verdict"] == "error" or not files:
        return {"latency_ms": None, "latency_note": "not exported"}
    if parity.get("method") != "runtime":
        why = f"{parity.get('simulator') or parity.get('runtime')} is a simulator" if parity.get("method") == "simulated" \
            else parity.get("reason") or "no runtime here"
        return {"latency_ms": None, "latency_note": why}
    import numpy as np

    runtime = RUNTIMES.get(EXPORTERS.get(artifact["exporter"]).runtime)
    session = runtime.load(files, threads)
    dtype = artifact.get("io_float_dtype") or "float32"
    inputs = [np.zeros(s["shape"], dtype if s["dtype"].startswith("float") else s["dtype"]) for s in artifact["inputs"]]
    session.run(inputs)  # warm-up: first-call allocations and kernel selection
    times = []
    for _ in range(LATENCY_RUNS):
        start = time.perf_counter()
        session.run(inputs)
        times.append((time.perf_counter() - start) * 1000)
    return {"latency_ms": round(statistics.median(times), 3), "latency_note": f"{runtime.name}, {threads or 'its default'} threads, median of {LATENCY_RUNS}"}


def in_situ_runner(rows: list[dict], out: Path, frames: int | None, threads: int | None, progress: Callable[[str], None] | None = None):
    """`run(placement lines) -> pipeline report`: `edgex pipeline` over the sweep's published folders
    (every calibration size's), the stages picked by the placement (`edgex.in_situ.run_pipeline`)."""
    from ..in_situ import run_pipeline

    progress = progress or (lambda _m: None)
    folders = [Path(out) / folder for folder in dict.fromkeys(r["folder"] for r in rows)]

    def run(placement: list[str]) -> dict:
        progress(f"in situ: {' '.join(placement)}")
        return run_pipeline(folders, placement, frames, threads)

    return run
