"""`edgex build` on the local executor runs its jobs as `edgex export` does: side by side, the eager
model loaded once for every job that needs it, each job committed to the cache when it finishes;
and what it writes is what `edgex export` writes for the same jobs (verdicts and sha256)."""

from __future__ import annotations

import pytest

from conftest import ONE_JOB_BUILD
from edgex.build.run import run_build
from edgex.export import export_model

pytestmark = pytest.mark.xdist_group("build-local")

TWO_JOBS = ONE_JOB_BUILD.replace('["fp32"]', '["fp32", "fp16"]')


def test_a_build_of_two_jobs_loads_the_model_once_and_runs_them_side_by_side(tmp_path, monkeypatch):
    from edgex import scheduler

    loads = []
    original = scheduler.Source.load

    def counted(self, *args, **kwargs):  # the scheduler's one way to build an eager model
        loads.append((self.model, self.preset))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(scheduler.Source, "load", counted)
    file = tmp_path / "two.toml"
    file.write_text(TWO_JOBS)
    lines: list[str] = []
    monkeypatch.setenv("EDGEX_CACHE_DIR", str(tmp_path / "edgex-cache"))  # nothing another test cached serves these jobs
    data = run_build(file, tmp_path / "out", cache_dir=tmp_path / "build-cache", progress=lines.append, executor=None)
    assert data["status"] == "pass" and len(data["artifacts"]) == 2
    assert len(loads) == 1, loads
    # both jobs started before either finished (each export's lines: "... -> onnx fp16", "...: pass")
    starts = [i for i, line in enumerate(lines) if "talker_decode -> onnx" in line]
    ends = [i for i, line in enumerate(lines) if line.endswith("talker_decode onnx fp32: pass")
            or line.endswith("talker_decode onnx fp16: pass")]
    assert len(starts) == 2 and len(ends) == 2 and max(starts) < min(ends), lines

    manifest = export_model("qwen3-tts", "cpu", tmp_path / "export", preset="tiny", components=["talker_decode"],
                            formats=["onnx"], precisions=["fp32", "fp16"], threads=1, jobs=2)
    exported = {a["precision"]: (a["verdict"], a["job_key"], sorted((f["path"], f["sha256"]) for f in a["files"]))
                for a in manifest["artifacts"]}
    built = {a["precision"]: (a["verdict"], a["build"]["key"], sorted((f["path"], f["sha256"]) for f in a["files"]))
             for a in data["artifacts"]}
    assert built == exported
