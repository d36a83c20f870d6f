"""`python -m edgex.build.executors.child SCRATCH`: one export job in a fresh process, on a Ray node.

Reads the job, its cache key and the driver's key inputs from `SCRATCH/job.pickle`; computes the
key again here (same edgex source, toolchain, Python, machine, CPU features and weights give the same key) and
exports only if it matches, into `SCRATCH/out`; writes `SCRATCH/result.json` last, so a process
that dies leaves no result. Dies with its parent, the Ray worker.
"""

from __future__ import annotations

import json
import pickle
import sys
import time
from pathlib import Path


def main(scratch: Path) -> None:
    from ...artifacts.files import strict_json, write_json_atomic
    from ...isolation import die_with_parent

    die_with_parent()
    from ...logs import quiet_libraries

    quiet_libraries()
    from ...artifacts.keys import weights_inputs
    from ..cache import Cache
    from ..commit import export_job, job_key_inputs
    from .worker import JOB_FILE, OUT_DIR, RESULT_FILE

    job, key, driver_inputs = pickle.loads((scratch / JOB_FILE).read_bytes())
    cache = Cache(scratch / "key")
    inputs = job_key_inputs(cache, job, weights_inputs(job.model, job.preset, Path(job.checkpoint) if job.checkpoint else None))
    if cache.key(inputs) != key:
        differ = sorted(k for k in set(inputs) | set(driver_inputs) if inputs.get(k) != driver_inputs.get(k))
        write_json_atomic(scratch / RESULT_FILE, {
            "error": f"this node's {', '.join(differ)} differ(s) from the driver's, so its artifact and verdict would not be "
                     "the ones the cache key names: install the same edgex and toolchain on every node, on one CPU kind "
                     "(the features edgex doctor prints)"})
        return
    started = time.perf_counter()
    manifest = export_job(job, scratch / OUT_DIR, lambda message: print(message, flush=True))
    write_json_atomic(scratch / RESULT_FILE, strict_json({"manifest": manifest,
                                                          "export_seconds": round(time.perf_counter() - started, 3)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
