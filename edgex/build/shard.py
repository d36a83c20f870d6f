"""Split a build's jobs over N CI machines, deterministically and balanced by expected cost.

Expected cost per job: the seconds it took last time, when a previous build's `build.json` is given
(`--costs`), else a table by exporter x role (tiny-preset orders of magnitude: ExecuTorch's XNNPACK
lowering and the QNN compile + simulator dominate, the unrolled predictor and the conv decoder are
the largest graphs). Jobs go, most expensive first, to the shard with the least cost so far (LPT);
ties break on the job id and the lowest shard index, so every machine computes the same split
from the same plan without talking to the others.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import EdgexError
from .spec import BuildJob

EXPORTER_SECONDS = {"executorch": 60.0, "qnn": 45.0, "coreml": 40.0, "mnn": 20.0, "onnx": 15.0, "gguf": 10.0}
ROLE_FACTOR = {"predictor": 3.0, "decoder": 2.0}


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


def recorded_costs(path: Path | None) -> dict[str, float]:
    """Job id -> export seconds recorded in a previous build's build.json (its first export, when reused)."""
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
        return {a["id"]: float(a["build"]["export_seconds"]) for a in data["artifacts"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EdgexError(f"--costs {path}: not a build.json written by edgex build ({exc})") from None


def expected_cost(job: BuildJob, recorded: dict[str, float]) -> float:
    if job.id in recorded:
        return recorded[job.id]
    return EXPORTER_SECONDS.get(job.exporter, 30.0) * ROLE_FACTOR.get(job.role, 1.0)


def partition(jobs: list[BuildJob], count: int, recorded: dict[str, float]) -> list[list[BuildJob]]:
    """`count` shards of the jobs (each keeps plan order), balanced by expected cost."""
    loads = [0.0] * count
    members: list[set[str]] = [set() for _ in range(count)]
    for job in sorted(jobs, key=lambda j: (-expected_cost(j, recorded), j.id)):
        shard = min(range(count), key=lambda s: (loads[s], s))
        loads[shard] += expected_cost(job, recorded)
        members[shard].add(job.id)
    return [[j for j in jobs if j.id in ids] for ids in members]
