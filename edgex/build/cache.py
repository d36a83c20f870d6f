"""Content-addressed cache of single-artifact exports.

An entry is the output of one `export_model` call for one job, stored at `<cache>/<key>/` with
`key.json` beside it. The key is the sha256 of everything the artifact's bytes and its parity
verdict are a function of, as `edgex.artifacts.keys` defines it (shared with `edgex export`'s
unchanged re-export): the edgex source, tool versions, Python and machine; model, target, weights
(preset, or every checkpoint file's sha256 and the files outside it the model is built from), seed,
recipe options and the versions of the packages its reference runs; and the job (component, role,
exporter, precision, exporter options, placement, the gates it is held to, parity threads, the
versions of its exporter's and runtime's packages). What is
outside the key (host CPU, eager thread count) is said there.

Reuse re-hashes every recorded file (sha256 and size); an entry with a missing or altered file is
deleted and exported again. An entry appears only by renaming a complete temporary folder to its
key, so a build killed mid-export leaves only a `.tmp-` folder, swept by the next build.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ..artifacts.files import MANIFEST, intact, write_json_atomic
from ..artifacts.keys import digest, environment, job_inputs, source_inputs
from .spec import BuildJob

TMP_PREFIX = ".tmp-"
KEY_FILE = "key.json"


class Cache:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.environment = environment()

    def sweep(self) -> int:
        """Remove temporary folders a killed build left behind (call only under the output lock)."""
        stale = [p for p in self.root.glob(f"{TMP_PREFIX}*") if p.is_dir()]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return len(stale)

    def key_inputs(self, job: BuildJob, weights: dict) -> dict:
        """`weights`: `edgex.artifacts.keys.weights_inputs` of the job's model and checkpoint (hashed
        once per checkpoint by the caller)."""
        return {**self.environment, **source_inputs(job.model, job.target, weights, job.seed, dict(job.settings)),
                **job_inputs(job.planned, dict(job.min_db), job.threads)}

    @staticmethod
    def key(inputs: dict) -> str:
        return digest(inputs)

    def path(self, key: str) -> Path:
        return self.root / key

    def lookup(self, key: str) -> dict | None:
        """The entry's manifest if every file it records is intact; a damaged entry is removed."""
        entry = self.path(key)
        if not entry.is_dir():
            return None
        try:
            manifest = json.loads(files_root(entry).joinpath(MANIFEST).read_text())
            json.loads((entry / KEY_FILE).read_text())
        except (OSError, ValueError, StopIteration):
            manifest = None
        if manifest is None or not intact(manifest, files_root(entry)):
            shutil.rmtree(entry, ignore_errors=True)
            return None
        return manifest

    def staging(self, key: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{key[:16]}-", dir=self.root))

    def commit(self, staged: Path, key: str, inputs: dict, record: dict) -> Path:
        """Make a finished export the entry for `key`: one rename. If another build committed the same
        key meanwhile, its entry stands (same key, same inputs) and ours is dropped."""
        write_json_atomic(staged / KEY_FILE, {"key": key, "inputs": inputs, **record})
        try:
            os.rename(staged, self.path(key))
        except OSError:
            if not self.path(key).is_dir():
                raise
            shutil.rmtree(staged, ignore_errors=True)
        return self.path(key)

    def discard(self, key: str) -> None:
        shutil.rmtree(self.path(key), ignore_errors=True)


def files_root(entry: Path) -> Path:
    """`export_model` writes <entry>/<model>/<target>/manifest.json; its file paths are relative to that folder."""
    return next(entry.glob(f"*/*/{MANIFEST}")).parent
