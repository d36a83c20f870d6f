"""Job processes die with the export: a killed `edgex export --jobs 2` must not leave the jobs it
runs side by side, or the lowering processes they fork, lowering on as orphans (they did, for
minutes, before PR_SET_PDEATHSIG)."""

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
        # two job processes at once (forked from the export, sharing its model), each in its scratch folder
        if len(list(tmp_path.rglob(".job-*"))) >= 2:
            workers = parent.children()
            if len(workers) >= 2:
                break
        time.sleep(0.2)
    assert len(workers) >= 2 and proc.poll() is None, "the export finished or never ran two jobs at once"
    descendants = parent.children(recursive=True)  # the jobs, and any lowering process one has forked
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(descendants, timeout=30)
    assert not alive, [p.pid for p in alive]
