"""`edgex sweep`: points planned through the build planner, run through the build cache (reused
after a re-hash), one table / JSON / CSV / PNG, and a recommendation that `edgex export` accepts.

One small sweep of the components Spark-X2.5's pipeline needs (prefill and decode, ONNX fp32 + fp16,
the fp16 gate set out of reach on purpose so a failed point must show) is run once through the CLI,
its recommendation tried in situ and then fed to `edgex pipeline --placement @FILE`, and once more
from the cache."""

from __future__ import annotations

import csv
import json

import pytest

from conftest import cli_here, run_cli
from edgex.build.cache import Cache
from edgex.errors import EdgexError
from edgex.plan import make_plan, read_placements
from edgex.sweep.plan import sweep_jobs
from edgex.sweep.run import run_sweep

pytestmark = pytest.mark.xdist_group("sweep")

ARGS = ("spark-x2.5", "--target", "cpu", "-c", "prefill,decode", "-f", "onnx", "-p", "fp32,fp16", "--min-db", "fp16=200")


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    proc = cli_here("sweep", *ARGS, "--out", str(out), "--json")
    return out, proc


def test_sweep_writes_table_json_csv_png_and_keeps_failed_points(swept):
    out, proc = swept
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    rows = {(r["component"], r["precision"]): r for r in summary["rows"]}
    assert set(rows) == {(c, p) for c in ("prefill", "decode") for p in ("fp32", "fp16")}
    for component in ("prefill", "decode"):
        fp32, fp16 = rows[component, "fp32"], rows[component, "fp16"]
        assert fp32["verdict"] == "pass" and float(fp32["min_snr_db"]) > 60
        assert fp16["verdict"] == "fail", "a 200 dB gate cannot be met: the point stays, marked failed"
        assert float(fp16["scheme_db"]) > 30 and float(fp16["lowering_db"]) > 30, "split figures as the gate reports them"
        assert summary["pareto"][component] == [summary["rows"].index(fp32)], "only passing points are on the front"
    assert all(r["bytes"] > 0 and r["export_s"] > 0 and r["latency_ms"] > 0 for r in rows.values())
    with open(out / "sweep.csv") as f:
        table = list(csv.DictReader(f))
    assert sorted(r["verdict"] for r in table) == ["fail", "fail", "pass", "pass"]
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| onnx fp16 |" in (out / "sweep.md").read_text()
    assert summary["recommendation"] == {"prefill": "prefill=onnx:fp32", "decode": "decode=onnx:fp32"}, "the best *passing* artifacts"
    assert summary["objective"] == {"prefill": "latency_ms", "decode": "latency_ms"}, "measured here for every passing point"
    situ = summary["in_situ"]
    assert situ["verdict"] == "pass" and situ["placement"] == ["prefill=onnx:fp32", "decode=onnx:fp32"], situ
    assert [t["placement"] for t in situ["tried"]] == [situ["placement"]], "the failed fp16 points are never tried"
    assert "# in situ: pass (edgex pipeline), placement 1 of at most 3" in (out / "recommended.placement").read_text()
    assert (out / "spark-x2.5" / "cpu" / "manifest.json").is_file(), "published as a build: verify and pipeline read it"


def test_the_recommended_placement_passes_edgex_pipeline(swept):
    """The README's second line: the sweep's recommendation file picks the stages of `edgex pipeline`."""
    out, proc = swept
    assert proc.returncode == 0, proc.stderr[-2000:]
    ran = cli_here("pipeline", "spark-x2.5", str(out / "spark-x2.5" / "cpu"), "--placement", f"@{out / 'recommended.placement'}",
                  "--frames", "8", "--json")
    assert ran.returncode == 0, ran.stderr[-2000:]
    report = json.loads(ran.stdout)
    assert report["verdict"] == "pass" and report["failures"] == []
    assert report["free_running"]["token_agreement"] == 1.0 and report["free_running"]["agreed_steps"] == 8, report["free_running"]
    assert sorted((a["component"], a["format"], a["precision"]) for a in report["artifacts"]) == [
        ("decode", "onnx", "fp32"), ("prefill", "onnx", "fp32")], "the stages the recommendation names, not the target's default"


def test_a_second_sweep_reuses_every_point_after_rehashing(swept):
    out, proc = swept
    assert proc.returncode == 0, proc.stderr[-2000:]
    jobs = sweep_jobs("spark-x2.5", "cpu", components=["prefill", "decode"], formats=["onnx"], precisions=["fp32", "fp16"],
                      min_db={"fp16": 200.0})
    again = run_sweep(jobs, out)
    assert [r["reused"] for r in again["rows"]] == [True] * 4
    cache = Cache(out / ".edgex-cache")
    key = next(a for a in again["artifacts"] if a["component"] == "decode" and a["precision"] == "fp32")["build"]["key"]
    artifact = next((cache.path(key)).glob("*/*/decode.fp32.onnx*"))
    with open(artifact, "r+b") as f:  # same size, other bytes: only the hash sees it
        f.seek(100)
        f.write(b"\x00" * 8)
    assert cache.lookup(key) is None, "a damaged entry is not trusted (and removed)"


def test_the_recommended_placement_is_accepted_by_export(swept):
    out, proc = swept
    assert proc.returncode == 0, proc.stderr[-2000:]
    placed = cli_here("export", "spark-x2.5", "--target", "cpu", "--placement", f"@{out / 'recommended.placement'}",
                     "--dry-run", "--json", "--out", str(out / "follow"))
    assert placed.returncode == 0, placed.stderr
    jobs = json.loads(placed.stdout)["jobs"]
    assert sorted((j["component"], j["format"], j["precision"]) for j in jobs) == [("decode", "onnx", "fp32"), ("prefill", "onnx", "fp32")]


def test_calibration_sizes_are_points_of_the_calibrated_schemes_only():
    jobs = sweep_jobs("qwen3-tts", "s25-htp", components=["talker_decode"], precisions=["fp16", "w8a16"], calibrations=[8, 16])
    assert [(j.precision, dict(j.exporter_options).get("calibration_size"), j.name) for j in jobs] == [
        ("fp16", None, "qwen3-tts-cal8"), ("w8a16", 8, "qwen3-tts-cal8"), ("w8a16", 16, "qwen3-tts-cal16")]
    cache = Cache.__new__(Cache)
    cache.environment = {}
    keys = {Cache.key(cache.key_inputs(j, {"preset": j.preset})) for j in jobs}
    assert len(keys) == 3, "the calibration size is part of the artifact's cache key"


def test_placement_files_name_components_and_calibration(tmp_path):
    path = tmp_path / "p.placement"
    path.write_text("# comment\ntalker_decode=qnn:w8a16:16  # 12 dB\n\npredictor=qnn:fp16\n")
    assert read_placements([f"@{path}"]) == ["talker_decode=qnn:w8a16:16", "predictor=qnn:fp16"]
    plan = make_plan("qwen3-tts", "s25-htp", tmp_path, placements=[f"@{path}"], components=["talker_prefill", "talker_decode"])
    jobs = {j.component: j for j in plan.jobs}
    assert (jobs["talker_decode"].precision, dict(jobs["talker_decode"].options)["calibration_size"]) == ("w8a16", 16)
    assert dict(jobs["talker_decode"].placement)["device"] == "Hexagon v79 HTP", "the target's device facts are kept"
    assert jobs["talker_prefill"].precision == "fp16", "a component's placement does not move its role's other components"
    for bad, fragment in (("talker_decode=qnn:fp16:16", "not calibrated"), ("nosuch=qnn:fp16", "no role 'nosuch'"),
                          ("talker_decode=qnn", "expected ROLE=EXPORTER:PRECISION")):
        with pytest.raises(EdgexError, match=fragment):
            make_plan("qwen3-tts", "s25-htp", tmp_path, placements=[bad])
    with pytest.raises(EdgexError, match="cannot read placement file"):
        read_placements([f"@{tmp_path / 'missing'}"])


def test_a_key_given_twice_is_placed_in_both(tmp_path):
    plan = make_plan("qwen3-tts", "s25-htp", tmp_path, components=["code2wav"],
                     placements=["decoder=onnx:fp32", "decoder=onnx:fp16", "decoder=qnn:fp16"])
    assert sorted((j.exporter, j.precision) for j in plan.jobs) == [("onnx", "fp16"), ("onnx", "fp32"), ("qnn", "fp16")]
    onnx = next(j for j in plan.jobs if j.exporter == "onnx")
    assert dict(onnx.placement)["device"] == "Adreno GPU (QNN GPU backend)", "the target's device facts are kept"
    for bad, fragment in ((["decoder=onnx:fp16", "decoder=onnx:fp16"], "given twice"),
                          (["talker=qnn:w8a16:8", "talker=qnn:w8a8:16"], "one calibration size per exporter")):
        with pytest.raises(EdgexError, match=fragment):
            make_plan("qwen3-tts", "s25-htp", tmp_path, placements=bad)


def test_bad_sweep_input_is_one_line(tmp_path):
    proc = run_cli("sweep", "qwen3-tts", "--calibration", "8,x", "--out", str(tmp_path))
    assert proc.returncode == 2 and "bad --calibration 'x'" in proc.stderr and "Traceback" not in proc.stderr


def _row(component, precision, size, db=30.0, verdict="pass", latency=None):
    return {"component": component, "exporter": "qnn", "precision": precision, "bytes": size, "min_snr_db": db, "gate_db": 10.0,
            "verdict": verdict, "latency_ms": latency, "explicit_calibration": False, "calibration": None}


def test_the_recommendation_is_tried_in_situ_in_objective_order_up_to_its_bound():
    """The smallest passing talker fails in situ: it is not recommended; the next placement in
    objective order (bytes here: nothing measured a latency) is run and recommended, with its
    objective, floor and in-situ verdict stated. When none of the first N passes, none is named.
    Latency is the objective where every passing point has one; failed points are never tried."""
    from edgex.sweep.recommend import recommend
    from edgex.sweep.report import placement_line, placement_text

    rows = [_row("prefill", "fp16", 600), _row("prefill", "w8a8", 400), _row("prefill", "w4a16", 300, verdict="fail"),
            _row("decode", "fp16", 650), _row("decode", "w8a8", 440), _row("decode", "w8a16", 480)]
    tried = []

    def run(placement):  # w8a8 decode is what fails the composed pipeline
        tried.append(placement)
        return {"verdict": "fail" if "decode=qnn:w8a8" in placement else "pass", "failures": ["free-running audio 4.6 dB"]}

    result = recommend(rows, ("prefill", "decode"), placement_line, run, bound=3)
    assert tried == [["prefill=qnn:w8a8", "decode=qnn:w8a8"], ["prefill=qnn:w8a8", "decode=qnn:w8a16"]]
    assert result["objective"] == {"prefill": "bytes", "decode": "bytes"}
    assert result["in_situ"]["verdict"] == "pass" and result["chosen"]["decode"]["precision"] == "w8a16"
    text = placement_text("spark-x2.5", "s25-htp", result)
    assert "decode=qnn:w8a16  # 30.0 dB >= gate 10.0 dB" in text and "# in situ: pass (edgex pipeline), placement 2 of at most 3" in text
    assert "objective per component (best first): prefill bytes, decode bytes" in text and "# floor: " in text

    tried.clear()
    none = recommend(rows, ("prefill", "decode"), placement_line, lambda p: tried.append(p) or {"verdict": "fail", "failures": ["x"]}, bound=2)
    assert len(tried) == 2 and none["in_situ"]["verdict"] == "fail" and none["chosen"] == {"prefill": None, "decode": None}
    assert "none of the first 2 placement(s) in objective order passed in situ" in placement_text("m", "t", none)

    tried.clear()
    partial = recommend(rows[3:], ("prefill", "decode"), placement_line, lambda p: tried.append(p) or {"verdict": "pass", "failures": []})
    assert tried == [] and partial["in_situ"]["verdict"] == "not run" and "prefill" in partial["in_situ"]["reason"], "a stage was not swept"
    assert partial["chosen"]["decode"]["precision"] == "w8a8", "the objective's best, stated as not tried in situ"

    timed = [_row("decode", "fp16", 650, latency=1.0), _row("decode", "w8a8", 440, latency=3.0)]
    fast = recommend(timed, (), placement_line, None)
    assert fast["objective"] == {"decode": "latency_ms"} and fast["chosen"]["decode"]["precision"] == "fp16"
    assert fast["in_situ"]["verdict"] == "not run" and "no in-situ pipeline" in fast["in_situ"]["reason"]


def test_a_stage_served_by_its_alternative_component_is_no_failure_of_the_sweep():
    """Qwen3-TTS's predictor stage is the frame graph or the step graph the runner loops: when the
    placement that passes in situ deploys the step graph, the frame graph is recommended nowhere
    and `served_by` names the step graph, so `edgex sweep` exits 0 (it exited 1 on the default
    sweep); a component with no passing point still has none and no server."""
    from edgex.sweep.recommend import recommend
    from edgex.sweep.report import placement_line

    rows = [_row("prefill", "fp16", 600), _row("frame", "fp16", 900), _row("step", "fp16", 300), _row("other", "fp16", 10, verdict="fail")]
    result = recommend(rows, ("prefill", ("frame", "step")), placement_line, lambda p: {"verdict": "pass", "failures": []})
    assert result["in_situ"]["verdict"] == "pass" and result["chosen"]["step"] and result["chosen"]["frame"] is None
    assert result["served_by"] == {"frame": "step"}
    assert result["chosen"]["other"] is None and "other" not in result["served_by"]
