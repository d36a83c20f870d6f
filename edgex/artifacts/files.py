"""Atomic file placement, content hashes and strict-JSON manifests.

An export builds its whole output layout in a staging folder next to its destination (artifacts,
`failed/`, `hub/`), writes the manifest, and only then renames the staged files into place
(`publish`), so an interrupted or failed export never leaves artifacts without their manifest: a
crash before the manifest is written leaves nothing, one after it leaves a manifest whose files are
missing or differ from their hashes, which `edgex verify` rejects.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from ..errors import EdgexError

STAGING_PREFIX = ".staging-"
MANIFEST = "manifest.json"  # beside the artifacts of one <out>/<model>/<target>/ folder


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def file_record(path: Path, root: Path) -> dict:
    return {"path": str(path.relative_to(root)), "sha256": sha256(path), "bytes": path.stat().st_size}


def intact(manifest: dict, root: Path) -> bool:
    """Every file the manifest records is under `root` with its recorded size and sha256."""
    for artifact in manifest["artifacts"]:
        for record in artifact.get("files", []):
            path = root / record["path"]
            if not path.is_file() or path.stat().st_size != record["bytes"] or sha256(path) != record["sha256"]:
                return False
    return True


def file_records(path: Path, root: Path) -> list[dict]:
    """One record for a file; one per contained file for a folder artifact (a Core ML .mlpackage)."""
    if path.is_dir():
        return [file_record(p, root) for p in sorted(path.rglob("*")) if p.is_file()]
    return [file_record(path, root)]


def ensure_writable_dir(path: Path) -> Path:
    """Create `path` (and parents) or fail with a one-line reason."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".probe-", delete=True)
        probe.close()
    except OSError as exc:
        raise EdgexError(f"output directory {path} is not writable: {exc.strerror or exc}") from None
    return path


@contextmanager
def staging_dir(parent: Path) -> Iterator[Path]:
    """A private folder in `parent` (same filesystem, so renames out of it are atomic), always removed.
    Its name holds this process's id: one that a killed export left (SIGKILL runs no clean-up, and a
    published-size export stages gigabytes) is removed by the next export into `parent`."""
    sweep_orphaned_staging(parent)
    path = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep_orphaned_staging(parent: Path) -> None:
    """Remove the staging folders in `parent` whose exporting process is gone."""
    import psutil

    for path in Path(parent).glob(f"{STAGING_PREFIX}*-*"):
        pid = path.name[len(STAGING_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def move_into_place(files: list[Path], dest_dir: Path) -> list[Path]:
    """Rename staged files into `dest_dir`, replacing older versions atomically file by file. A folder
    artifact replaces its older version as a whole: the old one is renamed aside, then removed."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    placed = []
    for file in files:
        target = dest_dir / file.name
        if file.is_dir() and target.exists():
            old = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=dest_dir)) / target.name
            os.replace(target, old)
            os.replace(file, target)
            shutil.rmtree(old.parent, ignore_errors=True)
        else:
            os.replace(file, target)
        placed.append(target)
    return placed


def publish(stage: Path, dest: Path, containers: tuple[str, ...] = ()) -> None:
    """Rename a staged layout into `dest`. Each child of `stage` is one artifact (a file, or a folder
    artifact replaced as a whole), except the `containers` (`failed/`, `hub/` ...), whose children
    are artifacts placed under the same folder in `dest`. Names starting with "." are scratch and
    stay behind."""
    for child in sorted(stage.iterdir()):
        if child.name.startswith("."):
            continue
        if child.name in containers and child.is_dir():
            move_into_place([unit for unit in sorted(child.iterdir()) if not unit.name.startswith(".")], dest / child.name)
        else:
            move_into_place([child], dest)


def strict_json(value):
    """`value` with every non-finite float written as a string ("inf", "-inf", "nan") and numpy
    scalars as Python numbers: JSON has no inf/nan, and an exact tensor (SNR inf) must not crash or
    corrupt a manifest. The one place every manifest and report passes through before it is written."""
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        if not math.isfinite(value):
            return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def write_json_atomic(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(strict_json(data), f, indent=2, allow_nan=False)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# ONNX's loader refuses an external-data file that has more than one hard link ("potential hardlink
# attack", onnx 1.18 and later), so `onnx.load` of a published model would fail on a linked one.
NEVER_LINKED = (".onnx.data",)


def link_or_copy(source: Path, dest: Path) -> None:
    """A hard link where the filesystem allows (a build's tree and its cache share the bytes), else a
    copy; files a loader refuses as links (`NEVER_LINKED`) are always copied."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.name.endswith(NEVER_LINKED):
        shutil.copy2(source, dest)
        return
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)
