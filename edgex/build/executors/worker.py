"""The body of one Ray task: a batch of export jobs of one model, on the node Ray placed it on.

The batch runs in one freshly spawned Python process (`edgex.build.executors.child`): torch and the
exporters are not fork-safe inside a Ray worker, and the batch's memory ends with its process. That
process builds the eager model once and runs the batch's jobs side by side, as a local build does
(`edgex.build.commit.export_jobs`), each job in a process forked from it. The task gives it a
scratch folder of its own under this node's temporary folder, waits for it, and returns what each
job exported, file bytes and manifest, to the driver, which verifies and commits them; nothing on
this node outlives the task but the checkpoints it was sent (`<tmp>/edgex-ray/checkpoints/<sha256>`,
kept for the next batch of the same weights). A scratch folder left by a killed worker is removed by
the next task on the node. The worker's own process is what Ray retries when it is lost (the whole
batch again); the batch's process dies with it (`die_with_parent`).

This module imports neither torch nor Ray at import time: Ray pickles the task by reference to it.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

JOB_FILE, RESULTS_DIR, LOG_FILE, OUT_DIR = "batch.pickle", "results", "batch.log", "out"
SCRATCH_PREFIX = "job-"


def node_root() -> Path:
    root = Path(tempfile.gettempdir()) / "edgex-ray"
    root.mkdir(parents=True, exist_ok=True)
    return root


def _sweep_scratch(root: Path) -> None:
    """Remove scratch folders whose worker (the pid in the name) is gone."""
    for path in root.glob(f"{SCRATCH_PREFIX}*"):
        try:
            os.kill(int(path.name.split("-")[1]), 0)
        except (ValueError, IndexError):
            continue
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except PermissionError:
            pass


def materialize(root: Path, sha256: str, fetch) -> Path:
    """The checkpoint of content hash `sha256` as a folder on this node: kept from an earlier job,
    else written from `fetch()` ({relative path: bytes}, sent by the driver), checked against the hash
    and renamed into place whole."""
    from ...artifacts.keys import tree_sha256

    final = root / "checkpoints" / sha256
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
    try:
        for rel, data in fetch().items():
            path = staged / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        got = tree_sha256(staged)
        if got != sha256:
            raise RuntimeError(f"the checkpoint received has content sha256 {got[:12]}, not {sha256[:12]}")
        try:
            os.rename(staged, final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return final


def _describe(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        return f"was killed by {name}" + (" (out of memory? the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else "")
    return f"exited with status {code} without a result"


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def run_export_batch(jobs: list, keys: list[str], inputs: list[dict], checkpoint: tuple[str, list] | None,
                     workers: int) -> dict:
    """Export `jobs` (`BuildJob`s of one model) here, `workers` side by side; `checkpoint`: (content
    sha256, [ObjectRef of its files]) or None. Returns {"node", "results"}: per job, in order,
    {"manifest", "export_seconds", "files": {path: bytes}, "checkpoint_path"}, or {"error": reason}
    when the batch's process ended before the job finished or this node's environment gives another
    cache key than the driver's."""
    root = node_root()
    _sweep_scratch(root)
    node = socket.gethostname()
    local_checkpoint = None
    if checkpoint is not None:
        import ray

        sha256, refs = checkpoint
        local_checkpoint = str(materialize(root, sha256, lambda: ray.get(refs[0])))
        jobs = [replace(job, checkpoint=local_checkpoint) for job in jobs]
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-{keys[0][:12]}-", dir=root))
    try:
        (scratch / JOB_FILE).write_bytes(pickle.dumps((jobs, keys, inputs, workers)))
        package_parent = str(Path(__file__).resolve().parents[3])  # the edgex this worker runs
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, (package_parent, os.environ.get("PYTHONPATH")))))
        with open(scratch / LOG_FILE, "wb") as log:
            code = subprocess.call([sys.executable, "-m", "edgex.build.executors.child", str(scratch)],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)
        results = []
        for i in range(len(jobs)):
            path = scratch / RESULTS_DIR / f"{i}.json"
            if not path.is_file():
                last = _last_line(scratch / LOG_FILE)
                results.append({"error": f"the batch's process on {node} {_describe(code)} before this job finished"
                                         + (f"; its last line: {last}" if last else "")})
                continue
            result = json.loads(path.read_text())
            if "error" not in result:
                out = scratch / OUT_DIR / str(i)
                result["files"] = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
                result["checkpoint_path"] = local_checkpoint
            results.append(result)
        return {"node": node, "results": results}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
