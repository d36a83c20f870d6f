"""Export worker processes die with the export: a killed `edgex export --jobs 2` must not leave
workers, or the job processes they fork, lowering on as orphans (they did, for minutes, before
PR_SET_PDEATHSIG)."""

import os
import signal
import subprocess
import time

import psutil
import pytest

from conftest import EDGEX


@pytest.mark.skipif(not os.sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_workers_die_when_the_export_is_killed(tmp_path):
    proc = subprocess.Popen([*EDGEX, "export", "qwen3-tts", "--preset", "tiny", "-c", "talker_decode", "-f", "onnx",
                             "-p", "fp32,fp16", "--jobs", "2", "--out", str(tmp_path), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parent = psutil.Process(proc.pid)
    deadline = time.monotonic() + 300
    workers = []
    while time.monotonic() < deadline and proc.poll() is None:
        # a worker is past its initializer once a job's scratch folder exists in the staging area
        if any(tmp_path.rglob(".job-*")):
            workers = [c for c in parent.children() if "spawn_main" in " ".join(c.cmdline())]
            if len(workers) == 2:
                break
        time.sleep(0.5)
    assert len(workers) == 2 and proc.poll() is None, "the export finished or never started its workers"
    descendants = parent.children(recursive=True)  # the workers, and any job process one has forked
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(descendants, timeout=30)
    assert not alive, [p.pid for p in alive]
