"""What one export job asks a Ray cluster for: CPUs and memory, and whether any node can give it.

Memory: the largest peak RSS recorded for the same job (its id) in the manifests the build cache
holds (every earlier export of it, under any key: the figures outlive an edgex or toolchain change),
times `HEADROOM`; else a default by exporter and role. The recorded figure is the lowering's peak
(`export_peak_rss_mb`, measured in the process that lowers, which holds the eager model too); the
headroom covers the parity run after it. Ray's `memory` is a scheduling figure, not a limit: it
keeps Ray from packing more jobs on a node than its memory holds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ...artifacts.files import MANIFEST
from ...errors import EdgexError
from ..spec import BuildJob

HEADROOM = 1.5
MB = 2**20
# Peak RSS (MB) of one job's process on the tiny presets (torch, the eager model, the lowering and
# the runtime), rounded up; larger roles scaled as `edgex.build.shard` scales their cost.
DEFAULT_MB = {"executorch": 2500, "qnn": 2500, "coreml": 2500, "mnn": 2000, "onnx": 2000, "gguf": 2000}
ROLE_FACTOR = {"predictor": 2.0, "decoder": 1.5}


@dataclass(frozen=True)
class Demand:
    job: BuildJob
    cpus: int
    memory: int  # bytes
    why: str  # where the memory figure comes from

    def describe(self) -> str:
        return f"{self.cpus} CPU, {self.memory / 2**30:.1f} GiB memory ({self.why})"


def recorded_peaks(cache_root: Path) -> dict[str, float]:
    """Job id -> the largest lowering peak RSS (MB) the cache's manifests record for it."""
    peaks: dict[str, float] = {}
    for key_file in Path(cache_root).glob("*/key.json"):
        try:
            job_id = json.loads(key_file.read_text())["id"]
            manifest = json.loads(next(key_file.parent.glob(f"*/*/{MANIFEST}")).read_text())
        except (OSError, ValueError, KeyError, TypeError, StopIteration):
            continue
        for artifact in manifest.get("artifacts", []):
            peak = artifact.get("export_peak_rss_mb")
            if isinstance(peak, (int, float)) and peak > peaks.get(job_id, 0):
                peaks[job_id] = float(peak)
    return peaks


def demand(job: BuildJob, peaks: dict[str, float]) -> Demand:
    cpus = max(1, job.threads or 1)
    if job.id in peaks:
        mb, why = peaks[job.id] * HEADROOM, f"{HEADROOM}x the {peaks[job.id]:.0f} MB peak RSS recorded for it"
    else:
        mb = DEFAULT_MB.get(job.exporter, max(DEFAULT_MB.values())) * ROLE_FACTOR.get(job.role, 1.0)
        why = f"the default for a {job.exporter} {job.role} job"
    return Demand(job, cpus, int(math.ceil(mb)) * MB, why)


def check_fits(demands: list[Demand], nodes: list[dict]) -> None:
    """Refuse, before anything runs, a job no node of the cluster can take (`nodes`: each node's
    total resources as Ray reports them, `CPU` and `memory` in bytes)."""
    if not nodes:
        raise EdgexError("the Ray cluster has no live node")
    for d in demands:
        if not any(n.get("CPU", 0) >= d.cpus and n.get("memory", 0) >= d.memory for n in nodes):
            cpus, memory = max(n.get("CPU", 0) for n in nodes), max(n.get("memory", 0) for n in nodes)
            raise EdgexError(f"{d.job.id} needs {d.describe()}, more than any node of the Ray cluster has (at most "
                             f"{cpus:g} CPU, {memory / 2**30:.1f} GiB): add a larger node, or build it with --executor local")
