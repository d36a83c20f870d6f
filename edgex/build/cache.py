"""Content-addressed cache of single-artifact exports.

An entry is the output of one `export_model` call for one job, stored at `<cache>/<key>/` with
`key.json` beside it. The key is the sha256 of everything the artifact's bytes and its parity
verdict are a function of:

- `edgex_source`: the bytes of every file of the installed edgex package (recipes, exporters,
  runtimes, gates, targets, this module): any code change re-exports;
- `tool_versions`: `edgex.toolchain.versions()` (torch, executorch, onnx, onnxruntime, QAIRT,
  gguf, llama.cpp ...), plus the Python version and machine architecture;
- the weights: a preset name + seed (the preset's weights are generated from them by edgex source
  already hashed), or the sha256 of every file in the checkpoint folder, by relative path; the seed
  also drives the eager pipeline that makes the parity samples, so it is in the key either way;
- the job: model, target, component, role, exporter, precision, exporter options (SoC, calibration
  size), placement, recipe build options, the gate it is held to (the effective dB, so an override
  that does not apply to it does not invalidate it), parity threads.

Nothing else edgex passes to `export_model` changes it: edgex reads the environment only to quiet
library logs and the clock only for the manifest's `created`, and the targets' tables live in the
hashed source. Outside the key, and said so: the host CPU and the thread count torch runs the eager
model with (`OMP_NUM_THREADS`). Reductions in another order can move eager activations in the last
bits, hence calibration ranges of quantized schemes and parity figures in their last digits; and
llama.cpp is built for the host CPU. A reused entry keeps the figures measured when it was made,
on the host its manifest records.

Reuse re-hashes every recorded file (sha256 and size); an entry with a missing or altered file is
deleted and exported again. An entry appears only by renaming a complete temporary folder to its
key, so a build killed mid-export leaves only a `.tmp-` folder, swept by the next build.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path

from ..artifacts.files import MANIFEST, sha256, write_json_atomic
from ..toolchain import versions
from .spec import BuildJob

KEY_VERSION = 1
TMP_PREFIX = ".tmp-"
KEY_FILE = "key.json"


def tree_sha256(root: Path, skip=lambda p: False) -> str:
    """sha256 over (relative path, file sha256) of every file under `root`, in path order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file() and not skip(p)):
        digest.update(f"{path.relative_to(root).as_posix()}\0{sha256(path)}\n".encode())
    return digest.hexdigest()


def edgex_source_sha256() -> str:
    package = Path(__file__).resolve().parent.parent
    return tree_sha256(package, skip=lambda p: "__pycache__" in p.parts or p.suffix == ".pyc")


class Cache:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.environment = {"key_version": KEY_VERSION, "edgex_source": edgex_source_sha256(), "tool_versions": versions(),
                            "python": platform.python_version(), "machine": platform.machine()}

    def sweep(self) -> int:
        """Remove temporary folders a killed build left behind (call only under the output lock)."""
        stale = [p for p in self.root.glob(f"{TMP_PREFIX}*") if p.is_dir()]
        for path in stale:
            shutil.rmtree(path, ignore_errors=True)
        return len(stale)

    def key_inputs(self, job: BuildJob, checkpoint_sha256: str | None) -> dict:
        weights = {"checkpoint_sha256": checkpoint_sha256} if job.checkpoint else {"preset": job.preset}
        return {
            **self.environment,
            "model": job.model, **weights, "seed": job.seed, "settings": dict(job.settings),
            "target": job.target, "component": job.component, "role": job.role, "exporter": job.exporter,
            "precision": job.precision, "exporter_options": dict(job.exporter_options), "placement": dict(job.placement),
            "gate_db": job.gate_db, "threads": job.threads,
        }

    @staticmethod
    def key(inputs: dict) -> str:
        return hashlib.sha256(json.dumps(inputs, sort_keys=True, allow_nan=False).encode()).hexdigest()

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


def intact(manifest: dict, root: Path) -> bool:
    for artifact in manifest["artifacts"]:
        for record in artifact.get("files", []):
            path = root / record["path"]
            if not path.is_file() or path.stat().st_size != record["bytes"] or sha256(path) != record["sha256"]:
                return False
    return True
