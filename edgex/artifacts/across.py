"""Artifacts reused across output folders: `EDGEX_ARTIFACT_CACHE=DIR`.

An export reuses, job by job, what an earlier export into the same folder left
(`edgex.artifacts.reuse`). With `EDGEX_ARTIFACT_CACHE` set, it also looks in that folder: a planned
job whose key (the build cache's key of one artifact: edgex source, tools, machine, model, weights,
seed, options, the job and its gates; `edgex.artifacts.keys`) names an entry there gets that entry's
files copied into its output and its manifest entries marked `"reused": true` (as an unchanged job
of the same folder is) and `"reused_from": "EDGEX_ARTIFACT_CACHE"`. A job it builds whose entries
all passed is added there (failed, unverified and errored jobs are built again each time: an error
may be transient, and a failure is worth seeing built). This serves runs that export the same jobs
into fresh folders: a CI runner that keeps the folder between jobs, a test suite whose tests each
export into their own folder.

An entry is `<DIR>/<key>/` holding `entries.json` and the files at the paths those entries record. It
appears by renaming a complete temporary folder, and a lookup re-hashes every file (size and sha256):
an entry with a file missing or altered is removed and the job built. Files are copied both ways,
never linked, so a file an export's user changes in its folder never reaches the cache.

Light on import (no torch), as `edgex.artifacts.reuse`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from .files import intact, write_json_atomic

ENV = "EDGEX_ARTIFACT_CACHE"
ENTRIES = "entries.json"
_TMP = ".tmp-"


class ArtifactCache:
    def __init__(self, root: Path):
        self.root = Path(root)

    @classmethod
    def from_env(cls) -> "ArtifactCache | None":
        folder = os.environ.get(ENV)
        return cls(Path(folder).expanduser()) if folder else None

    def lookup(self, key: str) -> tuple[dict, Path] | None:
        """(`{"entries": [...], "source": ..., "options": ...}`, the folder its file paths are
        relative to), if every file it records is intact; a damaged entry is removed."""
        folder = self.root / key
        try:
            record = json.loads((folder / ENTRIES).read_text())
            if intact({"artifacts": record["entries"]}, folder):
                return record, folder
        except (OSError, ValueError, KeyError, TypeError):
            if not folder.is_dir():
                return None
        shutil.rmtree(folder, ignore_errors=True)
        return None

    def add(self, key: str, entries: list[dict], files_root: Path, source: dict, options: dict) -> None:
        """File one job's entries (and their files, under `files_root`) under `key`, if they all passed.
        A full disk or a read-only cache leaves it as it was: the export does not depend on it."""
        if not entries or any(e.get("verdict") != "pass" for e in entries) or (self.root / key).is_dir():
            return
        staged = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            staged = Path(tempfile.mkdtemp(prefix=_TMP, dir=self.root))
            _copy_files(entries, files_root, staged)
            clean = [{k: v for k, v in e.items() if k not in ("reused", "reused_from")} for e in entries]
            write_json_atomic(staged / ENTRIES, {"entries": clean, "source": source, "options": options})
            os.rename(staged, self.root / key)  # another export filed the same key meanwhile: its entry stands
        except OSError:
            pass
        finally:
            if staged is not None and staged.exists():
                shutil.rmtree(staged, ignore_errors=True)

    @staticmethod
    def place(record: dict, folder: Path, stage: Path) -> None:
        """Copy a looked-up entry's files from `folder` into `stage` at their recorded paths."""
        _copy_files(record["entries"], folder, stage)


def _copy_files(entries: list[dict], source: Path, dest: Path) -> None:
    """Every file `entries` record, from under `source` to the same path under `dest`."""
    for record in (r for e in entries for r in e.get("files", [])):
        (dest / record["path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source / record["path"], dest / record["path"])
