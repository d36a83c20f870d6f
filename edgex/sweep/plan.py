"""The sweep's points as build jobs: precisions x calibration sizes x components, through the
build planner (so every name is checked, light on import, before torch loads)."""

from __future__ import annotations

from pathlib import Path

from ..build.spec import BuildJob, entry_jobs
from ..plan import read_placements


def sweep_jobs(model: str, target: str, *, preset: str | None = None, checkpoint: Path | None = None, seed: int = 0,
               components: list[str] | None = None, formats: list[str] | None = None,
               precisions: list[str] | None = None, calibrations: list[int] | None = None,
               placements: list[str] | None = None, min_db: dict[str, float] | None = None,
               settings: dict[str, str] | None = None, threads: int | None = None) -> list[BuildJob]:
    """One build job per point. A calibration size only multiplies the calibrated schemes: an
    uncalibrated artifact (fp16) is one point, in the first calibration's folder. Each calibration
    size gets its own output folder (`<model>-cal<N>`): one folder holds one artifact per name."""
    jobs, seen = [], set()
    for size in calibrations or [None]:
        entry = {"model": model, "targets": [target], "seed": seed, "name": model if size is None else f"{model}-cal{size}"}
        entry |= {"checkpoint": str(Path(checkpoint).resolve())} if checkpoint else {"preset": preset} if preset else {}
        for key, value in (("components", components), ("formats", formats), ("precisions", precisions),
                           ("placements", read_placements(placements)), ("min_db", min_db), ("set", settings),
                           ("calibration", size), ("threads", threads)):
            if value:
                entry[key] = value
        for job in entry_jobs(0, entry, {}, Path.cwd(), "sweep"):
            point = (job.component, job.exporter, job.precision, job.exporter_options)
            if point not in seen:
                seen.add(point)
                jobs.append(job)
    return jobs
