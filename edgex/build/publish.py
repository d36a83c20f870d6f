"""Publishing a build: one output tree, per-folder manifests, build.json and the CI reports; and
`edgex build merge`, which publishes the union of shard outputs the same way.

Publishing never exposes a half-written tree: each output folder is assembled beside the old one
(hard links into the cache or the shard folder) and swapped in with two renames; reports are written
to temporary names and renamed. A build killed at any point leaves complete old files, complete new
files, or hidden `.staging-build-` folders that the next build sweeps. This module imports no
toolchain: the CI merge job needs only edgex, typer and rich.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..artifacts.files import MANIFEST, link_or_copy, sha256, write_bytes_atomic, write_json_atomic
from ..artifacts.lock import output_lock
from ..errors import EdgexError
from ..status import status
from .report import junit_xml, summary_json, summary_markdown

BUILD_JSON = "build.json"
STAGING_PREFIX = ".staging-build-"
# Errors that mean the output filesystem cannot take the build, not that an artifact is bad.
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
# Manifest fields that describe one export call rather than the folder (a published folder gathers
# many calls, so it records no `export_key`: `edgex export` into it is never an unchanged re-export)
PER_CALL = ("artifacts", "status", "seconds", "created", "gate_overrides", "export_key", "manifest_path", "reused")


@dataclass
class Outcome:
    """One job's manifest entries and where their files lie (None when it exported nothing)."""

    job_id: str
    folder: str
    header: dict
    artifacts: list[dict]
    root: Path | None


def disk_error(exc: OSError, out: Path) -> EdgexError:
    return EdgexError(f"cannot write the build to {out}: {exc.strerror or exc}; the build stopped and removed its temporary "
                      "files (published files are unchanged)")


def sweep(out: Path) -> None:
    for path in out.glob(f"{STAGING_PREFIX}*"):
        shutil.rmtree(path, ignore_errors=True)


def publish(out: Path, outcomes: list[Outcome], build: dict, started: float, verify_files: bool = False) -> dict:
    """Assemble each output folder and the reports beside the published ones, then move them in by
    renames only (which need no free space): a full disk stops the build before anything changed."""
    folders: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        folders.setdefault(outcome.folder, []).append(outcome)
    artifacts = [a for o in outcomes for a in o.artifacts]
    stage = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out))
    try:
        headers = {}
        for folder, items in folders.items():
            dest = stage / "new" / folder
            dest.mkdir(parents=True)
            for outcome in items:
                for artifact in outcome.artifacts:
                    for record in artifact.get("files", []):
                        source = outcome.root / record["path"]
                        if verify_files and (not source.is_file() or sha256(source) != record["sha256"]):
                            raise EdgexError(f"{source} does not match its manifest (sha256): the shard output is damaged")
                        link_or_copy(source, dest / record["path"])
            headers[folder] = _folder_header(items)
            entries = [a for o in items for a in o.artifacts]
            write_json_atomic(dest / MANIFEST, {
                **headers[folder], "created": _now(), "gate_overrides": {}, "artifacts": entries,
                "allow_unverified": build.get("allow_unverified", []),
                "status": status(entries, build.get("allow_unverified", [])),
                "seconds": round(sum(o.artifacts[0]["build"]["seconds"] for o in items if o.artifacts), 3)})
        build = {**build, "created": _now(), "seconds": round(time.perf_counter() - started, 3),
                 "status": status(artifacts, build.get("allow_unverified", []))}
        data = {"build": build, "status": build["status"], "folders": headers, "artifacts": artifacts}
        summary = summary_json(build, artifacts)
        reports = stage / "reports"
        reports.mkdir()
        write_json_atomic(reports / BUILD_JSON, data)
        write_bytes_atomic(reports / "junit.xml", junit_xml(build, artifacts))
        write_json_atomic(reports / "summary.json", summary)
        write_bytes_atomic(reports / "summary.md", summary_markdown(summary).encode())
        for folder in folders:
            final = out / folder
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():
                (stage / "old" / folder).parent.mkdir(parents=True, exist_ok=True)
                os.rename(final, stage / "old" / folder)
            os.rename(stage / "new" / folder, final)
        for report in reports.iterdir():
            os.replace(report, out / report.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return data


def _folder_header(items: list[Outcome]) -> dict:
    """The folder manifest's header: that of its first job that built the model (a job whose Ray task
    was lost exported nothing and records no model source)."""
    return next((o.header for o in items if "source" in o.header), items[0].header)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def merge(dirs: list[Path], out: Path) -> dict:
    """Join the outputs of `--shard 1/N` ... `--shard N/N` of one plan into one tree and report.
    Refuses shards of different plans, a missing or repeated shard, and files that do not match
    their recorded sha256."""
    started = time.perf_counter()
    shards = []
    for directory in dirs:
        path = Path(directory) / BUILD_JSON
        try:
            shards.append((Path(directory), json.loads(path.read_text())))
        except (OSError, ValueError) as exc:
            raise EdgexError(f"{path} is unreadable ({exc}): give the folders `edgex build --shard` wrote") from None
    plans = {data["build"]["plan_sha256"] for _, data in shards}
    if len(plans) != 1:
        raise EdgexError(f"the shards come from {len(plans)} different build plans; merge shards of one build file and edgex")
    if any(data["build"]["shard"] is None for _, data in shards):
        raise EdgexError("merge takes the outputs of `edgex build --shard I/N`; one folder is an unsharded build")
    count = shards[0][1]["build"]["shard"]["count"]
    indices = sorted(data["build"]["shard"]["index"] for _, data in shards)
    if indices != list(range(1, count + 1)) or any(d["build"]["shard"]["count"] != count for _, d in shards):
        raise EdgexError(f"need shards 1..{count} once each, got {', '.join(map(str, indices))}")
    plan_ids = shards[0][1]["build"]["plan_ids"]
    order = {job_id: i for i, job_id in enumerate(plan_ids)}
    outcomes = []
    for directory, data in shards:
        by_job: dict[str, list[dict]] = {}
        for artifact in data["artifacts"]:
            by_job.setdefault(artifact["id"], []).append(artifact)
        for job_id, artifacts in by_job.items():
            folder = artifacts[0]["folder"]
            outcomes.append(Outcome(job_id, folder, data["folders"][folder], artifacts, directory / folder))
    missing = set(plan_ids) - {o.job_id for o in outcomes}
    if missing:
        raise EdgexError(f"the shards lack {len(missing)} job(s) of the plan, e.g. {sorted(missing)[0]}")
    outcomes.sort(key=lambda o: order[o.job_id])
    first = shards[0][1]["build"]
    build = {key: first[key] for key in ("edgex_version", "file", "file_sha256", "plan_sha256", "plan_ids")}
    build["allow_unverified"] = first.get("allow_unverified", [])  # one build file: the shards agree
    build.update(jobs=len(plan_ids), shard=None, merged_from=[str(d) for d, _ in shards],
                 shard_seconds=[data["build"]["seconds"] for _, data in shards])
    try:
        with output_lock(out) as out:
            sweep(out)
            data = publish(out, outcomes, build, started, verify_files=True)
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:
            raise disk_error(exc, out) from None
        raise
    return data
