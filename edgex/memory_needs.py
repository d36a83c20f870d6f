"""What each planned job needs in memory, known before any model is built, and the refusal of an
export whose largest job cannot fit: one line at plan time, never an out-of-memory kill hours in.

A job's need is the peak resident memory of the process it runs in, a child forked from the
export's process that shares its eager model. Two sources, the first that knows:

- the peak the same job reached when an export last ran it (`job_peak_rss_mb`, kept in the export
  cache beside its seconds by `edgex.progress.JobCosts`, keyed by recipe, weights, component,
  exporter and precision);
- an estimate from what the plan knows without loading the model: the model's parameters (counted
  from the checkpoint folder's safetensors headers, else the size its preset's name or description
  states, `edgex.recipes.base.stated_parameters`) as fp32, the eager model's dtype, times the
  exporter's `memory_factor` (`edgex.exporters.base.Exporter`).

A job neither source knows (a preset that states no size: every `tiny` one) is not estimated and
never refused. An export is refused when its largest job's need exceeds what it may hold:
`--max-memory`, else what this process holds plus the memory the machine has available. A refusal
of an export that would have fit is as bad a bug as the kill it prevents, so an estimate is a floor,
not a guess: each exporter's factor is at most the smallest ratio of a recorded peak to its model's
fp32 weights, and a recorded peak is what the job took last time.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import EdgexError
from .plan import Job

MB = 2**20
FP32_BYTES = 4


@dataclass(frozen=True)
class Need:
    """A job's memory need in MiB and how it is known (`basis`, said in the refusal line)."""

    model: str
    job: Job
    mb: float
    basis: str

    def describe(self) -> str:
        return f"{self.model} {self.job.component} {self.job.exporter} {self.job.precision}"


def checkpoint_parameters(folder: Path) -> int | None:
    """The parameters the safetensors files under `folder` hold, from their headers alone (the
    shapes; no tensor is read). None when it has none, or a header cannot be read."""
    from .checkpoints import safetensors_header

    total = 0
    files = sorted(Path(folder).rglob("*.safetensors"))
    for file in files:
        try:
            header = safetensors_header(file)
            total += sum(math.prod(t["shape"]) for name, t in header.items() if name != "__metadata__")
        except (OSError, ValueError, struct.error, KeyError, TypeError):
            return None
    return total if files else None


def model_parameters(model: str, preset: str | None, checkpoint: Path | str | None) -> tuple[float, str] | None:
    """(parameters, where the count comes from) for the model the plan builds, or None."""
    from .recipes import RECIPES
    from .recipes.base import stated_parameters

    if checkpoint:
        count = checkpoint_parameters(Path(checkpoint))
        return (float(count), "the checkpoint's") if count else None
    facts = RECIPES.facts(model)
    preset = preset or facts.default_preset
    count = stated_parameters(preset, facts.presets.get(preset, ""))
    return (count, f"preset {preset}'s stated") if count else None


def job_needs(model: str, preset: str | None, checkpoint: Path | str | None, jobs: list[Job]) -> list[Need]:
    """Each job's need (module doc), for those of `jobs` some source knows."""
    from .exporters import EXPORTERS
    from .progress import JobCosts
    from .recipes import RECIPES

    if not checkpoint:
        preset = preset or RECIPES.facts(model).default_preset  # as the export cache keys it
    recorded = JobCosts.of(model, preset, checkpoint)
    unknown = object()
    parameters = unknown  # counted once, when some job has no recorded peak
    needs = []
    for job in jobs:
        peak = recorded.peak_mb(job)
        if peak is not None:
            needs.append(Need(model, job, float(peak), "its peak when an export last ran it"))
            continue
        if parameters is unknown:
            parameters = model_parameters(model, preset, checkpoint)
        if parameters is None:
            continue
        count, said = parameters
        factor = EXPORTERS.get(job.exporter).memory_factor
        needs.append(Need(model, job, count * FP32_BYTES * factor / MB,
                          f"an estimate: {said} {count / 1e9:.2f}B parameters as fp32 x {factor:g} for {job.exporter}"))
    return needs


def machine_mb() -> float:
    """What an export here may hold when no budget is given: what this process holds (with its
    children) plus the memory the machine has available."""
    import psutil

    from .side_by_side import held_mb

    return held_mb() + psutil.virtual_memory().available / MB


def refuse_oversized(needs: list[Need], max_memory_mb: float | None, available_mb=machine_mb) -> None:
    """Raise the one-line refusal when the largest need exceeds `max_memory_mb` (None: what the
    machine has, `available_mb()`)."""
    if not needs:
        return
    largest = max(needs, key=lambda need: need.mb)
    budget = max_memory_mb if max_memory_mb is not None else available_mb()
    if largest.mb <= budget:
        return
    if max_memory_mb is not None:
        room = f"the export may hold {_gb(budget)} (--max-memory)"
        todo = "raise --max-memory, leave that job out (--component, --format, --precision), or use a machine with more memory"
    else:
        room = f"this machine has {_gb(budget)} available"
        todo = ("free memory, leave that job out (--component, --format, --precision), or use a machine with more memory "
                "(--max-memory GB sets the budget instead)")
    raise EdgexError(f"{largest.describe()} needs about {_gb(largest.mb)} ({largest.basis}) and {room}: {todo}")


def _gb(mb: float) -> str:
    return f"{mb / 1024:.1f} GB"
