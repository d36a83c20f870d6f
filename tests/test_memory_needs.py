"""An export whose largest job cannot fit in memory is refused at plan time, in one line, before any
model is built or any folder made; one that fits is not (`edgex.memory_needs`)."""

import json
import struct

import pytest

from conftest import run_cli
from edgex.errors import EdgexError
from edgex.exporters import EXPORTERS
from edgex.memory_needs import MB, job_needs, refuse_oversized
from edgex.plan import Job, make_plan
from edgex.progress import JobCosts
from edgex.recipes import RECIPES
from edgex.recipes.base import stated_parameters

GIB = 1024  # MiB
PREFILL = ["--target", "cpu", "-c", "talker_prefill", "-f", "onnx", "-p", "fp32"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEX_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _record_peak(component: str, exporter: str, precision: str, peak_mb: float, preset: str = "tiny") -> None:
    """The cache as a finished export of qwen3-tts `preset` that ran this job leaves it."""
    JobCosts.of("qwen3-tts", preset, None).record(
        {"artifacts": [{"component": component, "exporter": exporter, "precision": precision, "job_seconds": 12.0,
                        "job_peak_rss_mb": peak_mb}], "seconds": 20.0})


def _plan_jobs(tmp_path):
    return make_plan("qwen3-tts", "cpu", tmp_path / "out", components=["talker_prefill"], formats=["onnx"],
                     precisions=["fp32"]).jobs


def test_a_job_whose_recorded_peak_exceeds_max_memory_is_refused_in_one_line(tmp_path, cache):
    _record_peak("talker_prefill", "onnx", "fp32", 5796.0)  # 5.66 GiB, as a 0.6b talker job peaked
    proc = run_cli("export", "qwen3-tts", *PREFILL, "--max-memory", "2", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("edgex: "), proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in ("qwen3-tts talker_prefill onnx fp32", "needs about 5.7 GB", "2.0 GB (--max-memory)", "raise --max-memory"):
        assert fragment in lines[0], lines[0]
    assert not (tmp_path / "out").exists()  # nothing written, not even the folder


def test_the_same_plan_under_a_larger_budget_is_not_refused(tmp_path, cache):
    _record_peak("talker_prefill", "onnx", "fp32", 5796.0)
    needs = job_needs("qwen3-tts", "tiny", None, _plan_jobs(tmp_path))
    assert [round(n.mb) for n in needs] == [5796]
    refuse_oversized(needs, 8 * GIB)  # --max-memory 8
    refuse_oversized(needs, None, available_mb=lambda: 23 * GIB)  # no budget given: what the machine has
    with pytest.raises(EdgexError, match=r"needs about 5\.7 GB .* this machine has 4\.0 GB available"):
        refuse_oversized(needs, None, available_mb=lambda: 4 * GIB)


def test_the_estimate_comes_from_the_checkpoints_weights_when_nothing_is_recorded(tmp_path, cache):
    folder = tmp_path / "ckpt"
    (folder / "speech_tokenizer").mkdir(parents=True)
    # headers only: the estimate reads shapes, never the tensors (bf16 on disk, fp32 in the eager model)
    for path, tensors in ((folder / "model.safetensors", {"a": [151936, 2048], "b": [28, 2048, 3072]}),
                          (folder / "speech_tokenizer" / "model.safetensors", {"c": [2048, 512]})):
        header = json.dumps({**{name: {"dtype": "BF16", "shape": shape, "data_offsets": [0, 0]} for name, shape in tensors.items()},
                             "__metadata__": {"format": "pt"}}).encode()
        path.write_bytes(struct.pack("<Q", len(header)) + header)
    parameters = 151936 * 2048 + 28 * 2048 * 3072 + 2048 * 512
    job = Job("talker_prefill", "talker", "qnn", "fp16")
    (need,) = job_needs("qwen3-tts", None, folder, [job])
    assert need.mb == pytest.approx(parameters * 4 * EXPORTERS.get("qnn").memory_factor / MB)
    assert "the checkpoint's 0.49B parameters as fp32" in need.basis
    with pytest.raises(EdgexError, match=r"needs about 2\.2 GB \(an estimate: the checkpoint's"):
        refuse_oversized([need], 2 * GIB)
    refuse_oversized([need], 3 * GIB)
    _record_peak("talker_prefill", "qnn", "fp16", 1000.0)  # a record of the preset is not this checkpoint's
    assert job_needs("qwen3-tts", None, folder, [job])[0].mb == need.mb


def test_a_laptop_budget_refuses_a_published_talker_and_no_recorded_working_case_is_refused(tmp_path, cache):
    talker = Job("talker_prefill", "talker", "qnn", "fp16")
    (need,) = job_needs("qwen3-tts", "0.6b", None, [talker])  # nothing recorded: the stated 0.6B
    with pytest.raises(EdgexError, match=r"qwen3-tts talker_prefill qnn fp16 needs about 2\.7 GB"):
        refuse_oversized([need], 2 * GIB)
    # The peaks recorded on a 23 GiB machine, each of an export that worked, and every published
    # preset's estimate on every format: none is refused there.
    machine = 23 * GIB
    for component, exporter, precision, gb in (("talker_prefill", "qnn", "fp16", 6.98), ("code2wav", "mnn", "fp32", 5.45)):
        _record_peak(component, exporter, precision, gb * 1000**3 / 2**20, preset="0.6b")
        refuse_oversized(job_needs("qwen3-tts", "0.6b", None, [Job(component, "x", exporter, precision)]), machine)
    for model in RECIPES.names():
        facts = RECIPES.facts(model)
        for preset, description in facts.presets.items():
            jobs = [Job("c", "r", exporter, "fp32") for exporter in EXPORTERS.names()]
            needs = job_needs(model, preset, None, jobs)
            assert bool(needs) == (stated_parameters(preset, description) is not None)  # tiny presets state no size
            refuse_oversized(needs, None, available_mb=lambda: machine)
