"""Nothing an export puts in the temporary folder outlives it. Forked jobs end with `os._exit`, so
the `atexit` clean-ups of the libraries they call never run: each job gets a private temporary
folder that its parent removes however the job ended (`edgex.isolation.run_forked`). Each test
points temp at a fresh folder (`fresh_tempdir`) and checks the job leaves it as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from edgex.component import SIGNAL, Component, TensorSpec
from edgex.errors import EdgexError
from edgex.isolation import ChildDied, run_forked

REPO = Path(__file__).resolve().parents[1]


def _mlp(seed: int = 0) -> Component:
    torch.manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16)).eval()
    samples = {name: (torch.randn(1, 4, 16),) for name in ("example", "held_out")}
    return Component("mlp", "decoder", module, [TensorSpec("x", (1, 4, 16), "float32")],
                     [TensorSpec("y", (1, 4, 16), "float32", SIGNAL)], lambda x: (module(x),), samples)


def test_what_a_forked_job_puts_in_temp_goes_with_it(fresh_tempdir):
    """Python's `tempfile` and the tools a job starts (`mktemp` reads `TMPDIR`) write into the
    job's own folder inside temp, which is gone when the job has returned; temp here is unchanged."""

    def job():
        return [tempfile.mkdtemp(), tempfile.NamedTemporaryFile(delete=False).name,
                subprocess.run(["mktemp"], capture_output=True, text=True, check=True).stdout.strip()]

    made = [Path(p) for p in run_forked(job)]
    assert len({p.parent for p in made}) == 1 and made[0].parent.parent == fresh_tempdir, made
    assert not list(fresh_tempdir.iterdir())
    assert tempfile.gettempdir() == str(fresh_tempdir) and os.environ["TMPDIR"] == str(fresh_tempdir)


def test_a_failed_or_killed_job_s_temp_folder_is_removed(fresh_tempdir):
    def fails():
        tempfile.mkdtemp()
        raise EdgexError("broken")

    def killed():  # as the OOM killer does
        tempfile.mkdtemp()
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(EdgexError, match="broken"):
        run_forked(fails)
    with pytest.raises(ChildDied, match="SIGKILL"):
        run_forked(killed)
    assert not list(fresh_tempdir.iterdir())


def test_a_core_ml_export_job_leaves_temp_as_it_was(fresh_tempdir, tmp_path):
    """coremltools converts to a `tmp*.mlpackage` in temp, which it removes only at exit."""
    pytest.importorskip("coremltools")
    from edgex.export import _start_isolated
    from edgex.plan import Job

    stage = tmp_path / "stage"
    stage.mkdir()
    before = set(fresh_tempdir.iterdir())  # importing coremltools here made torch's cache folder (torchinductor_<user>)
    (entry,) = _start_isolated(Job("mlp", "decoder", "coreml", "fp32"), _mlp(), stage, None, None, None).result()
    assert entry["verdict"] == "pass", entry
    assert set(fresh_tempdir.iterdir()) == before


def test_a_qnn_export_job_leaves_temp_as_it_was(fresh_tempdir, tmp_path):
    """The QNN exporter keeps the ONNX graph it compiles in an `edgex-qnn-graphs-*` folder in temp
    (up to 50 MB each at tiny), made in the lowering's process and again in the job's."""
    from edgex.export import _start_isolated
    from edgex.parity.runtimes import RUNTIMES
    from edgex.plan import Job
    from edgex.targets import TARGETS

    if RUNTIMES.get("qnn-htp").unavailable_reason():
        pytest.skip(RUNTIMES.get("qnn-htp").unavailable_reason())
    stage = tmp_path / "stage"
    stage.mkdir()
    before = set(fresh_tempdir.iterdir())
    job = Job("mlp", "decoder", "qnn", "fp16", tuple(TARGETS.get("s25-htp").exporter_options["qnn"].items()))
    entries = _start_isolated(job, _mlp(), stage, None, None, None).result()
    assert entries[0]["verdict"] == "pass", entries[0]
    assert set(fresh_tempdir.iterdir()) == before


def test_a_forked_child_never_removes_the_qnn_graphs_its_parent_keeps(fresh_tempdir, monkeypatch):
    """A child inherits the parent's kept graphs: clearing them (a new component, or a failure
    while making one) forgets them there but leaves the parent's folder, which it still reads."""
    import edgex.exporters.qnn_graphs as qnn_graphs

    monkeypatch.setattr(qnn_graphs.OnnxExporter, "graph", lambda _self, _component, _precision, dest: dest.write_bytes(b"graph"))
    monkeypatch.setattr(qnn_graphs, "for_the_htp", lambda dest: None)  # the stand-in graph is no ONNX
    graphs, component = qnn_graphs.Graphs(), _mlp()
    graph, _ = graphs.get(component, "fp16", None)
    run_forked(graphs.clear)
    run_forked(graphs.get, _mlp(seed=1), "fp16", None)  # other weights: clears, then makes its own
    assert graph.is_file() and graphs.get(component, "fp16", None)[0] == graph
    assert list(fresh_tempdir.iterdir()) == [graph.parent]
    graphs.clear()
    assert not list(fresh_tempdir.iterdir())


def test_the_suite_s_cost_cache_is_its_own():
    """The run below runs this in a pytest of its own, under xdist: the worker reads the folder its
    controller made."""
    assert Path(os.environ["EDGEX_CACHE_DIR"]).is_dir()


def test_a_test_run_removes_its_cost_cache_folder(tmp_path):
    """conftest.py's cost cache folder (`EDGEX_CACHE_DIR`) is made once per run, by pytest or
    xdist's controller (each worker imports conftest.py too), and removed when the run ends."""
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "EDGEX_CACHE_DIR"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "no:cacheprovider", "--basetemp",
                           str(tmp_path / "base"), "tests/test_temp_files.py::test_the_suite_s_cost_cache_is_its_own"],
                          cwd=REPO, env=env | {"TMPDIR": str(temp)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert not list(temp.glob("edgex-test-cache-*"))


def test_a_killed_export_s_staging_folder_is_removed_by_the_next_export_into_its_folder(tmp_path):
    """SIGKILL runs no clean-up: the staging folder of a killed export (named with its process id)
    goes when the next export stages into the same folder; a live process's stays."""
    from edgex.artifacts.files import STAGING_PREFIX, staging_dir

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = tmp_path / f"{STAGING_PREFIX}{int(gone.stdout)}-abc"
    live = tmp_path / f"{STAGING_PREFIX}{os.getppid()}-def"
    for folder in (dead, live):
        (folder / "prefix.fp32.pte").parent.mkdir()
        (folder / "prefix.fp32.pte").write_bytes(b"staged")
    with staging_dir(tmp_path) as stage:
        assert stage.name.startswith(f"{STAGING_PREFIX}{os.getpid()}-")
        assert not dead.exists() and live.exists()
    assert not stage.exists() and live.exists()
