"""`edgex build --executor ray` on a real two-node Ray cluster on 127.0.0.1 (one CPU and a small
object store per node): one task per model per node, the same artifacts, verdicts and hashes as the
local executor with a worker killed mid-job; a cache hit schedules no task; a lost task is its jobs'
error; a job larger than every node is refused before anything runs; `edgex export --executor ray`
writes the manifest a local export writes; no Ray process listens beyond loopback, on the test
cluster or on the embedded instance `--executor ray` starts without `--address`."""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from conftest import ONE_JOB_BUILD
from edgex.build.run import run_build
from edgex.errors import EdgexError

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.xdist_group("build-ray")

ONE_JOB = ONE_JOB_BUILD
TWO_JOBS = ONE_JOB_BUILD.replace('["fp32"]', '["fp32", "fp16"]')
JOB_ID = "qwen3-tts/cpu/talker_decode.fp32.onnx"
JOB_ID_FP16 = "qwen3-tts/cpu/talker_decode.fp16.onnx"
OBJECT_STORE = 80 * 2**20  # Ray's smallest
CHILD = "edgex.build.executors.child"


def digest(data: dict) -> dict:
    return {a["id"]: (a["verdict"], sorted((f["path"], f["sha256"]) for f in a["files"])) for a in data["artifacts"]}


def listening(processes) -> list[tuple[str, str]]:
    """(address, process name) of every listening TCP socket of `processes`."""
    found = []
    for process in processes:
        try:
            found += [(c.laddr.ip, process.name()) for c in process.net_connections("inet") if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            pass
    return found


def beyond_loopback(sockets) -> list[tuple[str, str]]:
    def loopback(ip: str) -> bool:
        address = ipaddress.ip_address(ip.split("%")[0])
        return address.is_loopback or (getattr(address, "ipv4_mapped", None) is not None and address.ipv4_mapped.is_loopback)

    return [s for s in sockets if not loopback(s[0])]


@pytest.fixture(scope="module")
def cluster():
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    with pytest.MonkeyPatch.context() as patch:
        # Node address 127.0.0.1 as the embedded instance has it (`edgex.build.executors.ray_cluster`).
        patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        patch.setenv("RAY_USAGE_STATS_ENABLED", "0")
        patch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)
        nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": OBJECT_STORE,
                                                              "include_dashboard": False})
        nodes.add_node(num_cpus=1, object_store_memory=OBJECT_STORE)
        ray.init(address=nodes.address, log_to_driver=False)
        nodes.wait_for_nodes()
        try:
            yield nodes
        finally:
            ray.shutdown()
            nodes.shutdown()


@pytest.fixture(scope="module")
def local_build(tmp_path_factory):
    """The two-job build file and its build by the local executor: what each Ray run is held to."""
    root = tmp_path_factory.mktemp("local")
    file = root / "two.toml"
    file.write_text(TWO_JOBS)
    return file, run_build(file, root / "out")


class WorkerKiller(threading.Thread):
    """Watches for the job's spawned process; `after` seconds into the first one, SIGKILLs its
    parent, the Ray worker running the task. `spawned`: every job process a Ray worker started (the
    processes a job forks for its lowering carry the same command line, and are left out)."""

    def __init__(self, after: float):
        super().__init__(daemon=True)
        self.after, self.seen, self.killed_at, self.stop = after, {}, None, threading.Event()

    @property
    def spawned(self) -> set[int]:
        return {pid for pid, parent in self.seen.items() if parent not in self.seen}

    def run(self) -> None:
        while not self.stop.is_set():
            for p in psutil.process_iter(["cmdline", "ppid"]):
                if CHILD in " ".join(p.info["cmdline"] or []) and p.pid not in self.seen:
                    self.seen[p.pid] = p.info["ppid"]
                    if self.killed_at is None and p.info["ppid"] not in self.seen:
                        time.sleep(self.after)
                        os.kill(p.info["ppid"], signal.SIGKILL)
                        self.killed_at = time.perf_counter()
            self.stop.wait(0.1)


def test_ray_build_matches_local_and_survives_a_killed_worker(cluster, local_build, tmp_path):
    """Two jobs of one model: one batch per node (each node builds the model once); the first
    batch's worker is killed mid-job and that batch runs again."""
    from edgex.build.executors.ray_cluster import RayExecutor

    file, local = local_build

    killer = WorkerKiller(after=1.0)
    killer.start()
    executor = RayExecutor(cluster.address)
    try:
        remote = run_build(file, tmp_path / "ray", executor=executor)
    finally:
        killer.stop.set()
    finished = time.perf_counter()
    assert killer.killed_at is not None and len(killer.spawned) == 3  # two batches, one killed mid-job and run again
    assert finished - killer.killed_at < 60
    assert sorted(executor.submitted) == sorted([JOB_ID, JOB_ID_FP16])
    assert sorted(len(ids) for _, ids in executor.batches) == [1, 1]
    assert {node for node, _ in executor.batches} == {n["NodeID"] for n in ray.nodes() if n["Alive"]}  # both nodes
    assert digest(remote) == digest(local) and remote["status"] == local["status"] == "pass"
    assert all(a["build"]["reused"] is False for a in remote["artifacts"])

    again = RayExecutor(cluster.address)
    cached = run_build(file, tmp_path / "ray", executor=again)
    assert again.submitted == [] and cached["artifacts"][0]["build"]["reused"] is True
    assert digest(cached) == digest(local)

    driver_and_nodes = [psutil.Process(), *psutil.Process().children(recursive=True)]
    sockets = listening(driver_and_nodes)
    assert any(name == "gcs_server" for _, name in sockets) and beyond_loopback(sockets) == []


def test_lost_task_is_the_jobs_error_and_a_job_larger_than_every_node_is_refused(cluster, tmp_path):
    from edgex.build.executors.ray_cluster import RayExecutor

    file = tmp_path / "one.toml"
    file.write_text(ONE_JOB)

    def worker_dies(*_args):  # a task whose worker process is lost on every attempt
        os._exit(1)

    started = time.perf_counter()
    data = run_build(file, tmp_path / "lost", executor=RayExecutor(cluster.address, max_retries=1, task=worker_dies))
    (artifact,) = data["artifacts"]
    assert time.perf_counter() - started < 60
    assert artifact["id"] == JOB_ID and artifact["verdict"] == "error" and data["status"] == "fail"
    assert artifact["error"].startswith("TaskFailed: the Ray task failed: WorkerCrashedError")
    assert not any((tmp_path / "lost" / ".edgex-cache").glob("*/key.json"))  # an error is never cached

    # An earlier export of the job recorded a 64 GB peak: 96 GiB asked, more than either node has.
    entry = tmp_path / "big" / ".edgex-cache" / ("0" * 64)
    (entry / "qwen3-tts" / "cpu").mkdir(parents=True)
    (entry / "key.json").write_text(json.dumps({"id": JOB_ID}))
    (entry / "qwen3-tts" / "cpu" / "manifest.json").write_text(json.dumps({"artifacts": [{"export_peak_rss_mb": 65536}]}))
    refused = RayExecutor(cluster.address)
    with pytest.raises(EdgexError, match=rf"{JOB_ID} needs 1 CPU, 96.0 GiB memory \(1.5x the 65536 MB peak RSS recorded"):
        run_build(file, tmp_path / "big", executor=refused)
    assert refused.submitted == []


def test_the_patch_switch_reaches_the_tasks_as_the_driver_has_it(cluster, tmp_path, monkeypatch):
    """`EDGEX_THIRD_PARTY_PATCHES` in a task's environment is the driver's, spelled out, whatever the
    nodes were started with (this cluster's, without it): a task that reports it as its job's error."""
    from edgex.build.executors.ray_cluster import RayExecutor
    from edgex.patches import SWITCH

    file = tmp_path / "one.toml"
    file.write_text(ONE_JOB)

    def reports_the_switch(jobs, *_args):
        return {"node": "n", "results": [{"error": f"switch {os.environ.get(SWITCH)}"} for _ in jobs]}

    seen = {}
    for switch in ("off", None):
        if switch is None:
            monkeypatch.delenv(SWITCH, raising=False)
        else:
            monkeypatch.setenv(SWITCH, switch)
        data = run_build(file, tmp_path / str(switch), executor=RayExecutor(cluster.address, task=reports_the_switch))
        seen[switch] = data["artifacts"][0]["error"]
    assert seen == {"off": "TaskFailed: switch off", None: "TaskFailed: switch on"}


def test_an_export_on_ray_writes_what_a_local_export_writes(cluster, local_build, tmp_path):
    """The Ray export's verdicts, job keys and files are the local build's of the same two jobs,
    which tests/test_build_local.py holds equal to a local export's."""
    from edgex.build.executors.ray_cluster import RayExecutor
    from edgex.build.executors.remote_export import ray_runner
    from edgex.export import export_model

    def files(a: dict) -> list:
        return sorted((f["path"], f["sha256"]) for f in a["files"])

    local = {(a["component"], a["precision"]): (a["verdict"], a["build"]["key"], files(a)) for a in local_build[1]["artifacts"]}
    executor = RayExecutor(cluster.address)
    manifest = export_model("qwen3-tts", "cpu", tmp_path / "ray", preset="tiny", components=["talker_decode"], formats=["onnx"],
                            precisions=["fp32", "fp16"], threads=1, runner=ray_runner(cluster.address, executor))
    remote = {(a["component"], a["precision"]): (a["verdict"], a.get("job_key"), files(a)) for a in manifest["artifacts"]}
    assert remote == local and manifest["status"] == "pass" and manifest["source"]["preset"] == "tiny"
    assert len(executor.batches) == 2  # the export's two jobs, one per node
    folder = tmp_path / "ray" / "qwen3-tts" / "cpu"
    assert sorted(p.name for p in folder.iterdir()) == sorted(["manifest.json", *(f for _, _, files in remote.values() for f, _ in files)])


EMBEDDED = """
import json, psutil, sys
from edgex.build.executors.ray_cluster import connected
with connected(None) as ray:
    processes = [psutil.Process(), *psutil.Process().children(recursive=True)]
    sockets = []
    for p in processes:
        try:
            sockets += [(c.laddr.ip, p.name()) for c in p.net_connections("inet") if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            pass
    nodes = [n["NodeManagerAddress"] for n in ray.nodes()]
json.dump({"sockets": sockets, "nodes": nodes}, sys.stdout)
"""


def test_embedded_instance_listens_on_loopback_only():
    proc = subprocess.run([sys.executable, "-c", EMBEDDED], capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["nodes"] == ["127.0.0.1"]
    sockets = [tuple(s) for s in report["sockets"]]
    assert any(name == "gcs_server" for _, name in sockets) and beyond_loopback(sockets) == []


def test_a_checkpoint_reaches_a_node_by_its_hash(tmp_path):
    from edgex.artifacts.keys import tree_sha256
    from edgex.build.executors.worker import materialize

    source = tmp_path / "ckpt"
    (source / "sub").mkdir(parents=True)
    (source / "config.json").write_text("{}")
    (source / "sub" / "model.safetensors").write_bytes(b"\x00\x01" * 1000)
    files = {p.relative_to(source).as_posix(): p.read_bytes() for p in source.rglob("*") if p.is_file()}
    sha = tree_sha256(source)
    node = tmp_path / "node"
    damaged = {**files, "config.json": b"{ }"}
    with pytest.raises(RuntimeError, match="content sha256"):
        materialize(node, sha, lambda: damaged)
    assert not (node / "checkpoints" / sha).exists() and list((node / "checkpoints").iterdir()) == []
    folder = materialize(node, sha, lambda: files)
    assert folder == node / "checkpoints" / sha and tree_sha256(folder) == sha
    assert materialize(node, sha, lambda: pytest.fail("fetched again")) == folder  # kept for the next job
