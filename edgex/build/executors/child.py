"""`python -m edgex.build.executors.child SCRATCH`: a batch of export jobs of one model in a fresh
process, on a Ray node.

Reads the jobs, their cache keys, the driver's key inputs and how many jobs run side by side from
`SCRATCH/batch.pickle`; computes each key again here (same edgex source, toolchain, Python, machine,
CPU features and weights give the same key) and exports the jobs whose key matches as one (`export_jobs`: the
eager model built once, the jobs side by side), each into `SCRATCH/out/<i>`. `SCRATCH/results/<i>.json`
is written when job `i` has finished, after its files, so a process that dies leaves no result for a
job it did not finish. Dies with its parent, the Ray worker.
"""

from __future__ import annotations

import pickle
import sys
from pathlib import Path


def main(scratch: Path) -> None:
    from ...artifacts.files import strict_json, write_json_atomic
    from ...isolation import die_with_parent

    die_with_parent()
    from ...logs import quiet_libraries

    quiet_libraries()
    from ...artifacts.keys import weights_inputs
    from ..cache import Cache
    from ..commit import export_jobs, job_key_inputs
    from .worker import JOB_FILE, OUT_DIR, RESULTS_DIR

    jobs, keys, driver_inputs, workers = pickle.loads((scratch / JOB_FILE).read_bytes())
    results = scratch / RESULTS_DIR
    results.mkdir()
    cache = Cache(scratch / "key")
    weights: dict = {}
    todo = []
    for i, (job, key, driver) in enumerate(zip(jobs, keys, driver_inputs)):
        source = (job.model, job.preset, job.checkpoint)
        if source not in weights:
            weights[source] = weights_inputs(job.model, job.preset, Path(job.checkpoint) if job.checkpoint else None)
        inputs = job_key_inputs(cache, job, weights[source])
        if cache.key(inputs) == key:
            todo.append(i)
            continue
        differ = sorted(k for k in set(inputs) | set(driver) if inputs.get(k) != driver.get(k))
        write_json_atomic(results / f"{i}.json", {
            "error": f"this node's {', '.join(differ)} differ(s) from the driver's, so its artifact and verdict would not be "
                     "the ones the cache key names: install the same edgex and toolchain on every node, on one CPU kind "
                     "(the features edgex doctor prints)"})

    def done(n: int, manifest: dict, seconds: float) -> None:
        write_json_atomic(results / f"{todo[n]}.json", strict_json({"manifest": manifest, "export_seconds": seconds}))

    export_jobs([(jobs[i], scratch / OUT_DIR / str(i)) for i in todo], lambda message: print(message, flush=True), done,
                workers)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
