"""Split a build's jobs over N CI machines, deterministically and balanced by expected cost.

Expected cost per job, from what earlier builds measured (`--costs`: a `build.json`, a build's
output folder holding one, or a build cache, whose entries each keep their manifest): the export
seconds recorded for the same job; else the median of those recorded for jobs of the same exporter
and role; else a default per exporter (`EXPORTER_SECONDS`, orders of magnitude on the tiny presets:
ExecuTorch's XNNPACK lowering and the QNN compile + simulator dominate). Jobs go, most expensive
first (the larger recorded peak memory first among equal costs), to the shard with the least cost
so far (LPT); ties break on the job id and the lowest shard index, so every machine computes the
same split from the same plan and the same `--costs` without talking to the others. The costs are
read from `--costs` only, never from a machine's own cache or output, which may differ between the
machines of one build.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from ..artifacts.files import MANIFEST
from ..errors import EdgexError
from .cache import KEY_FILE
from .spec import BuildJob

EXPORTER_SECONDS = {"executorch": 60.0, "qnn": 45.0, "coreml": 40.0, "mnn": 20.0, "onnx": 15.0, "gguf": 10.0}
DEFAULT_SECONDS = 30.0  # an exporter missing from EXPORTER_SECONDS


@dataclass
class Recorded:
    """What earlier builds measured, per job id: export seconds, peak memory of the lowering (MB,
    where recorded) and (exporter, role)."""

    seconds: dict[str, float] = field(default_factory=dict)
    peak_mb: dict[str, float] = field(default_factory=dict)
    kinds: dict[str, tuple[str, str]] = field(default_factory=dict)

    def add(self, job_id: str, seconds: float, entries: list[dict]) -> None:
        self.seconds[job_id] = float(seconds)
        peaks = [float(e["export_peak_rss_mb"]) for e in entries if e.get("export_peak_rss_mb") is not None]
        if peaks:
            self.peak_mb[job_id] = max(peaks)
        if entries and "exporter" in entries[0] and "role" in entries[0]:
            self.kinds[job_id] = (entries[0]["exporter"], entries[0]["role"])

    def kind_seconds(self) -> dict[tuple[str, str], float]:
        """(exporter, role) -> the median of the seconds recorded for jobs of that kind."""
        by_kind: dict[tuple[str, str], list[float]] = {}
        for job_id, kind in self.kinds.items():
            by_kind.setdefault(kind, []).append(self.seconds[job_id])
        return {kind: statistics.median(values) for kind, values in by_kind.items()}


def parse_shard(text: str) -> tuple[int, int]:
    """`2/4` -> (2, 4): the second of four shards (1-based, as CI matrices count)."""
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = 0
    if not sep or n < 1 or not 1 <= i <= n:
        raise EdgexError(f"bad --shard {text!r}: expected I/N with 1 <= I <= N, e.g. 1/2")
    return i, n


def recorded_costs(path: Path | None) -> Recorded:
    """What the build at `path` measured: its `build.json` (the first export's seconds for a reused
    artifact), a folder holding one, or a build cache (each entry's `key.json` and manifest)."""
    recorded = Recorded()
    if path is None:
        return recorded
    path = Path(path)
    try:
        if path.is_dir() and not (path / "build.json").is_file():
            for key in sorted(path.glob(f"*/{KEY_FILE}")):
                record = json.loads(key.read_text())
                manifests = sorted(key.parent.glob(f"*/*/{MANIFEST}"))
                entries = json.loads(manifests[0].read_text())["artifacts"] if manifests else []
                recorded.add(record["id"], record["export_seconds"], entries)
            if not recorded.seconds:
                raise ValueError("no build.json and no cache entry in it")
            return recorded
        data = json.loads((path / "build.json" if path.is_dir() else path).read_text())
        by_job: dict[str, list[dict]] = {}
        for entry in data["artifacts"]:
            by_job.setdefault(entry["id"], []).append(entry)
        for job_id, entries in by_job.items():
            recorded.add(job_id, entries[0]["build"]["export_seconds"], entries)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EdgexError(f"--costs {path}: not a build.json, build output or build cache written by edgex build ({exc})") from None
    return recorded


def expected_cost(job: BuildJob, recorded: Recorded, kinds: dict[tuple[str, str], float] | None = None) -> float:
    """Seconds `job` is expected to take (`kinds`: `recorded.kind_seconds()`, computed once by the caller)."""
    if job.id in recorded.seconds:
        return recorded.seconds[job.id]
    kinds = recorded.kind_seconds() if kinds is None else kinds
    if (job.exporter, job.role) in kinds:
        return kinds[job.exporter, job.role]
    return EXPORTER_SECONDS.get(job.exporter, DEFAULT_SECONDS)


def partition(jobs: list[BuildJob], count: int, recorded: Recorded) -> list[list[BuildJob]]:
    """`count` shards of the jobs (each keeps plan order), balanced by expected cost."""
    kinds = recorded.kind_seconds()
    cost = {j.id: expected_cost(j, recorded, kinds) for j in jobs}
    loads = [0.0] * count
    members: list[set[str]] = [set() for _ in range(count)]
    for job in sorted(jobs, key=lambda j: (-cost[j.id], -recorded.peak_mb.get(j.id, 0.0), j.id)):
        shard = min(range(count), key=lambda s: (loads[s], s))
        loads[shard] += cost[job.id]
        members[shard].add(job.id)
    return [[j for j in jobs if j.id in ids] for ids in members]
