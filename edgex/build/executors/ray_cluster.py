"""`--executor ray`: a build's uncached jobs as Ray tasks, one per model per node (`batches`), each
building its eager model once and running its jobs side by side.

Connecting: `--address` names an existing cluster (`ray.init(address=...)`: host:port of its head,
`auto`, or a `ray://` client address); without it an embedded Ray instance starts on this machine
and stops with the build: its node address is 127.0.0.1, so every Ray process listens on loopback
only, no dashboard, usage statistics off, a `OBJECT_STORE_BYTES` object store (larger objects
spill to disk).

Each task declares the CPUs its batch runs side by side and the memory its largest job needs
(`edgex.build.executors.memory`); a job no node can hold is refused before any task is submitted. A
task lost with its worker or node is retried, its whole batch (`MAX_RETRIES`); a task that still
fails is the `error` of each of its jobs, and a job whose process dies or that its batch's process
did not finish is that job's `error`, with the reason. Checkpoints travel by content hash through Ray's object store, one object
per checkpoint, materialized once per node; no filesystem is shared. The driver writes what a task
returns into a cache staging folder, checks every file against the manifest (sha256 and size) and
commits it with `edgex.build.commit.settle`, exactly as a local export. Leaving the build early
(Ctrl-C, an error) cancels the tasks still running. Each task runs with the driver's
`EDGEX_THIRD_PARTY_PATCHES` (`runtime_env` `env_vars`): a node's own environment does not decide
whether the speed-up patches run.
"""

from __future__ import annotations

import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from ...artifacts.files import MANIFEST, intact, write_json_atomic
from ...artifacts.keys import tree_sha256
from ...errors import EdgexError
from ...patches import switch_environment
from ...patches.ray import ray_settings
from ..cache import files_root
from ..shard import Recorded, recorded_costs
from .pending import Pending
from .memory import check_fits, demand, recorded_peaks
from .batches import Node, plan_batches
from .worker import run_export_batch

MAX_RETRIES = 2  # retries of a task whose worker process or node was lost
OBJECT_STORE_BYTES = 512 * 2**20  # the embedded instance's
POLL_SECONDS = 1.0


class TaskFailed(RuntimeError):
    """A job's Ray task ended without an export (its worker or node lost past the retries, the
    job's process killed, another environment on the node)."""


class RayExecutor:
    """`address`: an existing Ray cluster, or None for an embedded one. `submitted` lists the job
    ids sent to the cluster (a cache hit never is); `batches` the tasks, each a (node id, job ids)."""

    def __init__(self, address: str | None = None, max_retries: int = MAX_RETRIES, task: Callable = run_export_batch):
        self.address = address
        self.max_retries = max_retries
        self.task = task
        self.submitted: list[str] = []
        self.batches: list[tuple[str, list[str]]] = []

    @contextmanager
    def exports(self, pending: list[Pending], cache, progress, total: int) -> Iterator["RayExports"]:
        if not pending:  # everything cached: no cluster is needed, nothing is started
            yield RayExports(None, {}, {}, cache, progress, total)
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        peaks = recorded_peaks(cache.root)
        demands = {p.index: demand(p.job, peaks) for p in pending}
        with connected(self.address) as ray:
            alive = [n for n in ray.nodes() if n.get("Alive")]
            check_fits(list(demands.values()), [n["Resources"] for n in alive])
            nodes = [Node(n["NodeID"], int(n["Resources"].get("CPU", 0))) for n in alive if n["Resources"].get("CPU", 0) >= 1]
            remote = ray.remote(self.task)
            checkpoints = _send_checkpoints(ray, [p.job.checkpoint for p in pending if p.job.checkpoint])
            refs = {}
            for batch in plan_batches(pending, demands, nodes, _recorded(cache.root)):
                first = batch.items[0].job
                ref = remote.options(
                    num_cpus=batch.cpus, memory=batch.memory, max_retries=self.max_retries, retry_exceptions=False,
                    runtime_env={"env_vars": switch_environment()},
                    scheduling_strategy=NodeAffinitySchedulingStrategy(batch.node.node_id, soft=True),
                    name=f"edgex {first.name} x{len(batch.items)}",
                ).remote([p.job for p in batch.items], [p.key for p in batch.items], [p.inputs for p in batch.items],
                         checkpoints.get(first.checkpoint), batch.cpus)
                refs[ref] = [p.index for p in batch.items]
                self.batches.append((batch.node.node_id, [p.job.id for p in batch.items]))
                for p in batch.items:
                    self.submitted.append(p.job.id)
                    progress(f"[{p.index + 1}/{total}] {p.job.id}: submitted to Ray ({batch.describe()}, for node "
                             f"{batch.node.node_id[:8]})")
            exports = RayExports(ray, refs, {p.index: p for p in pending}, cache, progress, total)
            try:
                yield exports
            finally:
                exports.cancel()


def _recorded(cache_root: Path) -> Recorded:
    """What earlier exports in the build cache took (for balancing batches), or nothing."""
    try:
        return recorded_costs(cache_root)
    except EdgexError:  # an empty cache
        return Recorded()


@contextmanager
def connected(address: str | None):
    """Ray connected to `address`, or to an embedded loopback-only instance; disconnected (the
    embedded one stopped) on the way out, Ray's settings as they were (`patches.ray.ray_settings`).
    A connection this process already holds is used as is. Ray is imported inside the settings:
    some of them it reads when first imported."""
    import logging
    import sys

    held = sys.modules.get("ray")
    if held is not None and held.is_initialized():
        yield held
        return
    with ray_settings(embedded=address is None):
        try:
            import ray
        except ImportError as exc:
            raise EdgexError(f"--executor ray needs Ray ({exc}): install the `ray` extra (scripts/setup does)") from None
        if address is None:
            ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1",
                     object_store_memory=OBJECT_STORE_BYTES, log_to_driver=False, logging_level=logging.ERROR)
        else:
            try:
                ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise EdgexError(f"cannot connect to the Ray cluster at {address}: {str(exc).splitlines()[0]}") from None
        try:
            yield ray
        finally:
            ray.shutdown()


def _send_checkpoints(ray, folders: list[str]) -> dict[str, tuple[str, list]]:
    """Each checkpoint folder once into the object store: path -> (content sha256, [ObjectRef]).
    The reference travels inside a list so that a node holding the checkpoint already never fetches it."""
    sent = {}
    for folder in dict.fromkeys(folders):
        root = Path(folder)
        files = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        sent[folder] = (tree_sha256(root), [ray.put(files)])
        del files
    return sent


class RayExports:
    """`refs`: each task's ObjectRef -> the plan indices of its batch's jobs, in the batch's order."""

    def __init__(self, ray, refs: dict, pending: dict[int, Pending], cache, progress, total: int):
        self._ray, self._pending, self._cache = ray, pending, cache
        self._progress, self._total = progress, total
        self._waiting = dict(refs)
        self._done: dict[int, tuple[dict | None, str | None, float]] = {}  # value, failure, seconds since submit
        self._started = time.perf_counter()

    def result(self, index: int, progress: Callable[[str], None]):
        while index not in self._done:
            ready, _ = self._ray.wait(list(self._waiting), num_returns=1, timeout=POLL_SECONDS)
            for ref in ready:
                self._collect(ref)
        value, failure, _ = self._done.pop(index)
        item = self._pending.pop(index)
        started = time.perf_counter()
        if failure is None and "error" in value:
            failure = value["error"]
        if failure is not None:
            return _failed(item, failure), None, 0.0, round(time.perf_counter() - started, 3)
        manifest, root = self._commit(item, value)
        return manifest, root, value["export_seconds"], value["export_seconds"]

    def _collect(self, ref) -> None:
        indices = self._waiting.pop(ref)
        seconds = time.perf_counter() - self._started
        try:
            batch = self._ray.get(ref)
            values, failure, where = batch["results"], None, f"on {batch['node']}"
        except self._ray.exceptions.RayError as exc:
            values, failure = [None] * len(indices), f"the Ray task failed: {type(exc).__name__}: {_first_line(exc)}"
            where = "failed"
        for index, value in zip(indices, values):
            if value is not None:
                value = {**value, "node": batch["node"]}
            self._done[index] = (value, failure, seconds)
            self._progress(f"[{index + 1}/{self._total}] {self._pending[index].job.id}: finished {where} ({seconds:.1f} s "
                           "after submission)")

    def _commit(self, item: Pending, value: dict):
        """The task's files into a cache staging folder, checked against their manifest, then
        committed as a local export is (`settle`)."""
        from ..commit import settle

        staged = self._cache.staging(item.key)
        try:
            for rel, data in value["files"].items():
                path = staged / rel
                if not path.resolve().is_relative_to(staged.resolve()):
                    raise EdgexError(f"{item.job.id}: the task returned a file outside its folder ({rel})")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            manifest = value["manifest"]
            if value.get("checkpoint_path"):  # the node's copy of the checkpoint: name the driver's
                source = manifest.get("source") or {}
                for k, v in source.items():
                    if v == value["checkpoint_path"]:
                        source[k] = item.job.checkpoint
                write_json_atomic(files_root(staged) / MANIFEST, manifest)
            if not intact(manifest, files_root(staged)):
                shutil.rmtree(staged, ignore_errors=True)
                return _failed(item, f"the files returned from {value.get('node')} do not match their manifest (sha256)"), None
            return manifest, settle(item.job, self._cache, item.key, item.inputs, staged, manifest, value["export_seconds"])
        except BaseException:
            shutil.rmtree(staged, ignore_errors=True)
            raise

    def cancel(self) -> None:
        for ref in self._waiting:
            try:
                self._ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001 - finished meanwhile, or the cluster is gone
                pass
        self._waiting.clear()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _failed(item: Pending, reason: str) -> dict:
    """The manifest of a job that exported nothing: one `error` entry with the reason. It records
    no model source (the folder's manifest takes it from a job that ran)."""
    from ...export import error_entries

    job = item.job
    return {"model": job.model, "target": job.target, "artifacts": error_entries(job.planned, TaskFailed(reason))}
