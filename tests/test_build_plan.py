"""`edgex build` without exporting: the build file, shard partition, merge checks, JUnit text."""

from __future__ import annotations

import hashlib
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conftest import run_cli
from edgex.build.publish import merge
from edgex.build.report import junit_xml
from edgex.build.shard import EXPORTER_SECONDS, Recorded, expected_cost, parse_shard, partition, recorded_costs
from edgex.build.spec import load_plan
from edgex.errors import EdgexError


def plan_of(tmp_path: Path, text: str):
    file = tmp_path / "b.toml"
    file.write_text(text)
    return load_plan(file)


def test_entries_expand_to_one_job_per_artifact_with_their_gates(tmp_path):
    plan = plan_of(tmp_path, """
[[entry]]
model = "qwen3-tts"
targets = ["cpu", "llama-cpp"]
components = ["talker_decode", "code2wav"]
min_db = { "*" = 33, decoder = 40, "talker:q8_0" = 26 }
[[entry]]
model = "spark-x2.5"
name = "spark-ctx64"
targets = "s25-htp"
components = "decode"
precisions = ["fp16", "w8a16"]
calibration = 4
set = { max_context = 64 }
""")
    ids = [j.id for j in plan.jobs]
    assert ids == [
        "qwen3-tts/cpu/talker_decode.fp32.executorch", "qwen3-tts/cpu/talker_decode.fp16.executorch",
        "qwen3-tts/cpu/talker_decode.fp32.onnx", "qwen3-tts/cpu/talker_decode.fp16.onnx",
        "qwen3-tts/cpu/code2wav.fp32.executorch",  # the recipe keeps the vocoder fp32 on ExecuTorch
        "qwen3-tts/cpu/code2wav.fp32.onnx", "qwen3-tts/cpu/code2wav.fp16.onnx",
        "qwen3-tts/llama-cpp/talker_decode.f16.gguf", "qwen3-tts/llama-cpp/talker_decode.q8_0.gguf",
        "qwen3-tts/llama-cpp/talker_decode.q4_0.gguf",
        # llama.cpp's Code2Wav: libmtmd's, from the mmproj the recipe declares
        "qwen3-tts/llama-cpp/code2wav.f32.gguf", "qwen3-tts/llama-cpp/code2wav.f16.gguf", "qwen3-tts/llama-cpp/code2wav.q8_0.gguf",
        "spark-ctx64/s25-htp/decode.fp16.qnn", "spark-ctx64/s25-htp/decode.w8a16.qnn",
    ]
    gates = {j.id: j.gate_db for j in plan.jobs}
    assert gates["qwen3-tts/cpu/code2wav.fp16.onnx"] == 40 and gates["qwen3-tts/cpu/talker_decode.fp16.onnx"] == 33
    assert gates["qwen3-tts/llama-cpp/talker_decode.q8_0.gguf"] == 26
    w8 = plan.jobs[-1]
    assert dict(w8.exporter_options)["calibration_size"] == 4 and dict(w8.settings) == {"max_context": "64"}
    assert len(plan.digest) == 64 and plan.digest == plan_of(tmp_path, (tmp_path / "b.toml").read_text()).digest


@pytest.mark.parametrize("text, message", [
    ('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu"]\ncomponent = ["x"]', "unknown key(s) component"),
    ('[[entry]]\nmodel = "qwen4"\ntargets = ["cpu"]', "entry 1: no such model 'qwen4'"),
    ('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["S25"]', "no such target 'S25'"),
    ('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu"]\nprecisions = ["q8_0"]', "precision 'q8_0' is not supported"),
    ('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu"]\npreset = "huge"', "no such preset 'huge'"),
    ('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu"]\nmin_db = "high"', "min_db must be a number or a table"),
    ('[[entry]]\nmodel = "spark-x2.5"\ntargets = ["cpu"]\nset = { window = 3 }', "unknown option 'window'"),
    ('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu"]\ncheckpoint = "nowhere"', "is not a folder"),
    ('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu"]\ncomponents = ["talker_decode"]\n' * 2, "entries 1 and 2 both build"),
    ('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu"]\ncomponents = ["code2wav"]\n'
     '[[entry]]\nmodel = "qwen3-tts"\nseed = 1\ntargets = ["cpu"]\ncomponents = ["talker_decode"]', "give it a distinct name"),
    ('[build]\nseed = 0', "has no [[entry]]"),
    ('[[entry]\nmodel = ', "is not valid TOML"),
])
def test_bad_build_files_are_refused_before_anything_runs(tmp_path, text, message):
    with pytest.raises(EdgexError) as info:
        plan_of(tmp_path, text)
    assert message in str(info.value)


def test_bad_build_file_is_one_line_exit_2(tmp_path):
    file = tmp_path / "b.toml"
    file.write_text('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu"]\nformats = ["tflite"]')
    proc = run_cli("build", str(file), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"edgex: {file} entry 1: no such format 'tflite' (known: coreml, executorch, gguf, mnn, onnx, qnn)"]
    assert not (tmp_path / "out").exists()
    proc = run_cli("build", str(file), "--shard", "3/2")
    assert proc.returncode == 2 and "bad --shard '3/2'" in proc.stderr


def test_shards_are_deterministic_disjoint_complete_and_balanced(tmp_path):
    plan = plan_of(tmp_path, """
[[entry]]
model = "qwen3-tts"
targets = ["cpu", "s25-htp", "llama-cpp"]
[[entry]]
model = "spark-x2.5"
targets = ["cpu", "s25-htp", "llama-cpp", "mnn"]
""")
    for n in (1, 2, 3, 5):
        shards = partition(plan.jobs, n, Recorded())
        assert shards == partition(list(plan.jobs), n, Recorded())  # every CI machine computes the same split
        ids = [j.id for s in shards for j in s]
        assert sorted(ids) == sorted(j.id for j in plan.jobs) and len(set(ids)) == len(ids)
        loads = [sum(expected_cost(j, Recorded()) for j in s) for s in shards]
        biggest = max(expected_cost(j, Recorded()) for j in plan.jobs)
        assert max(loads) - min(loads) <= biggest  # greedy longest-first bound
        for shard in shards:  # plan order kept inside a shard
            assert [j.id for j in shard] == [j.id for j in plan.jobs if j in shard]
    # recorded seconds from an earlier build replace the table
    slow = plan.jobs[-1].id
    shards = partition(plan.jobs, 2, Recorded({slow: 10_000.0}))
    assert [j.id for j in shards[0]] == [slow]
    assert parse_shard("2/4") == (2, 4)
    for bad in ("0/2", "3/2", "1", "a/b", "1/0"):
        with pytest.raises(EdgexError, match="bad --shard"):
            parse_shard(bad)


def test_shard_costs_come_from_what_earlier_builds_measured(tmp_path):
    """--costs reads a build cache's entries (or a build.json): a job's own recorded seconds, else
    the median of its exporter and role's, else the exporter's default; a larger recorded peak
    memory goes first among equal costs."""
    plan = plan_of(tmp_path, """
[[entry]]
model = "spark-x2.5"
targets = ["cpu"]
""")
    onnx = [j for j in plan.jobs if j.exporter == "onnx"]
    other = next(j for j in plan.jobs if j.exporter != "onnx")
    measured = {onnx[0].id: (400.0, 900.0), onnx[1].id: (200.0, 100.0), onnx[2].id: (400.0, 2000.0)}
    cache = tmp_path / "cache"
    for n, (job_id, (seconds, peak)) in enumerate(measured.items()):
        entry = cache / f"key{n}"
        (entry / "m" / "cpu").mkdir(parents=True)
        (entry / "key.json").write_text(json.dumps({"id": job_id, "export_seconds": seconds}))
        (entry / "m" / "cpu" / "manifest.json").write_text(json.dumps({"artifacts": [
            {"exporter": "onnx", "role": onnx[0].role, "export_peak_rss_mb": peak}]}))
    recorded = recorded_costs(cache)
    assert recorded.seconds == {k: v[0] for k, v in measured.items()}
    assert [expected_cost(j, recorded) for j in onnx[:3]] == [400.0, 200.0, 400.0]
    assert all(expected_cost(j, recorded) == 400.0 for j in onnx[3:])  # the median of the onnx jobs of its role
    assert expected_cost(other, recorded) == EXPORTER_SECONDS[other.exporter]
    first = [j.id for j in partition(onnx[:3], 3, recorded)[0]]
    assert first == [onnx[2].id]  # 400 s and 2000 MB before 400 s and 900 MB
    with pytest.raises(EdgexError, match="--costs"):
        recorded_costs(tmp_path / "nothing-here")


def fake_shard(root: Path, index: int, count: int, plan_ids: list[str], mine: list[str], plan: str = "p" * 64) -> Path:
    """A shard output as `edgex build --shard` writes it: build.json, one file per artifact."""
    out = root / f"shard{index}"
    artifacts = []
    for job_id in mine:
        name = job_id.rsplit("/", 1)[1]
        data = name.encode()
        path = out / "m" / "cpu" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        artifacts.append({"id": job_id, "folder": "m/cpu", "component": name.split(".")[0], "format": "onnx",
                          "exporter": "onnx", "precision": "fp16", "verdict": "pass",
                          "parity": {"min_snr_db": 50.0, "threshold_db": 30.0, "method": "runtime", "samples": {}},
                          "files": [{"path": name, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}],
                          "build": {"key": "k" + name, "reused": False, "seconds": 1.0, "export_seconds": 1.0}})
    build = {"edgex_version": "0", "file": "b.toml", "file_sha256": "f", "plan_sha256": plan, "plan_ids": plan_ids,
             "jobs": len(mine), "shard": {"index": index, "count": count, "ids": mine}, "seconds": 1.0}
    (out / "build.json").write_text(json.dumps({"build": build, "status": "pass", "artifacts": artifacts,
                                                "folders": {"m/cpu": {"model": "m", "source": {}, "target": "cpu"}}}))
    return out


def test_merge_joins_shards_and_refuses_foreign_missing_or_damaged_ones(tmp_path):
    ids = ["m/cpu/a.fp16.onnx", "m/cpu/b.fp16.onnx", "m/cpu/c.fp16.onnx"]
    one, two = fake_shard(tmp_path, 1, 2, ids, [ids[1]]), fake_shard(tmp_path, 2, 2, ids, [ids[0], ids[2]])
    data = merge([two, one], tmp_path / "merged")
    assert [a["id"] for a in data["artifacts"]] == ids and data["status"] == "pass"
    assert recorded_costs(tmp_path / "merged" / "build.json").seconds == dict.fromkeys(ids, 1.0)  # --costs for the next split
    manifest = json.loads((tmp_path / "merged" / "m" / "cpu" / "manifest.json").read_text())
    assert [a["id"] for a in manifest["artifacts"]] == ids
    assert (tmp_path / "merged" / "m" / "cpu" / "b.fp16.onnx").read_bytes() == b"b.fp16.onnx"
    with pytest.raises(EdgexError, match=r"need shards 1..2 once each, got 1"):
        merge([one], tmp_path / "m2")
    other = fake_shard(tmp_path / "x", 2, 2, ids, [ids[0], ids[2]], plan="q" * 64)
    with pytest.raises(EdgexError, match="2 different build plans"):
        merge([one, other], tmp_path / "m3")
    short = fake_shard(tmp_path / "y", 2, 2, ids, [ids[0]])
    with pytest.raises(EdgexError, match="lack 1 job"):
        merge([one, short], tmp_path / "m4")
    (two / "m" / "cpu" / "c.fp16.onnx").write_bytes(b"tampered")
    with pytest.raises(EdgexError, match="does not match its manifest"):
        merge([one, two], tmp_path / "m5")
    assert not (tmp_path / "m5" / "m").exists() and not list((tmp_path / "m5").glob(".staging-*"))


def test_junit_failure_names_measured_and_required_db():
    artifact = {"id": "m/cpu/x.fp16.onnx", "folder": "m/cpu", "component": "x", "format": "onnx", "exporter": "onnx",
                "precision": "fp16", "verdict": "fail",
                "parity": {"min_snr_db": 21.04, "threshold_db": 30.0, "method": "runtime", "samples": {
                    "example": {"logits": {"snr_db": 21.04}, "hidden": {"snr_db": "inf"}}}},
                "files": [], "build": {"key": "k", "reused": True, "seconds": 0.1, "export_seconds": 9.0}}
    root = ET.fromstring(junit_xml({"seconds": 1.0}, [artifact]))
    failure = root.find("testsuite/testcase/failure")
    assert failure.get("message") == "min SNR 21.0 dB, required 30.0 dB (runtime)"
    assert failure.text.splitlines() == ["FAIL example/logits: 21.0 dB (required 30.0 dB)", "ok   example/hidden: inf dB (required 30.0 dB)"]
    assert root.get("failures") == "1" and root.find("testsuite/testcase/properties/property[@name='reused']").get("value") == "True"


def test_merge_runs_without_any_toolchain(tmp_path):
    """The CI merge job installs edgex, typer and rich only: merging must not import torch & co."""
    import subprocess
    import sys

    ids = ["m/cpu/a.fp16.onnx", "m/cpu/b.fp16.onnx"]
    one, two = fake_shard(tmp_path, 1, 2, ids, [ids[0]]), fake_shard(tmp_path, 2, 2, ids, [ids[1]])
    blocked = ["torch", "numpy", "onnx", "onnxruntime", "executorch", "transformers", "psutil", "gguf", "llama_cpp"]
    code = (f"import sys; sys.modules.update(dict.fromkeys({blocked!r})); from edgex.cli import app; "
            f"app(['build', 'merge', {str(one)!r}, {str(two)!r}, '--out', {str(tmp_path / 'merged')!r}])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "merged" / "build.json").read_text())["status"] == "pass"


def _entry(verdict, component="c", fmt="qnn-context", **more):
    return {"verdict": verdict, "component": component, "format": fmt, "exporter": "qnn", "precision": "fp16", **more}


def test_allow_unverified_names_kinds_and_a_job_with_nothing_run_is_never_a_pass(tmp_path):
    """One status rule for export, verify and build: an unverified entry is incomplete unless its
    kind (sidecar, or its format) is accepted by name; and a job none of whose entries ran and
    passed is incomplete whatever is accepted (an export whose every artifact is unverified)."""
    from edgex.status import EXIT_CODES, status

    dlc = _entry("unverified", fmt="qnn-dlc", sidecar_of="c.fp16.qnn.onnx")
    binary = _entry("pass")
    assert status([binary, dlc]) == "incomplete" and EXIT_CODES["incomplete"] == 3
    assert status([binary, dlc], ["sidecar"]) == "pass" and status([binary, dlc], ["qnn-dlc"]) == "pass"
    assert status([binary, dlc], ["onnx"]) == "incomplete"  # another format accepts nothing here
    unread = _entry("unverified")  # the context binary ran, a table was not read back
    assert status([unread, dlc], ["sidecar"]) == "incomplete", "a sidecar kind does not accept the artifact itself"
    assert status([unread, dlc], ["sidecar", "qnn-context"]) == "incomplete", "nothing of the job ran and passed"
    assert status([binary, dlc, _entry("unverified", component="d"), _entry("unverified", component="d", fmt="qnn-dlc",
                                                                            sidecar_of="d")], ["sidecar", "qnn-context"]) == "incomplete"
    assert status([_entry("unverified", fmt="qnn-dlc", sidecar_of="x"), _entry("fail")], ["sidecar"]) == "fail"
    assert status([binary, _entry("error", component="d")]) == "fail" and status([binary]) == "pass"

    entry = '[[entry]]\nmodel = "qwen3-tts"\npreset = "tiny"\ntargets = ["cpu"]\ncomponents = ["talker_decode"]\n'
    file = tmp_path / "allow.toml"
    file.write_text('[build]\nallow_unverified = ["sidecar", "qnn-dlc"]\n' + entry)
    assert load_plan(file).allow_unverified == ("qnn-dlc", "sidecar")
    file.write_text(entry)
    assert load_plan(file).allow_unverified == ()
    for value, message in (("true", "names the kinds accepted unverified"), ('"yes"', "names the kinds"),
                           ('["everything"]', "no such kind 'everything' \\(known: sidecar, gguf")):
        file.write_text(f"[build]\nallow_unverified = {value}\n" + entry)
        with pytest.raises(EdgexError, match=message):
            load_plan(file)
    ci = Path(__file__).resolve().parent.parent / "builds" / "ci.toml"
    assert load_plan(ci).allow_unverified == ("sidecar",)


def test_an_unknown_min_db_key_is_an_error_when_the_plan_is_read_and_reproducibility_is_labelled_declared(tmp_path):
    """A job whose artifact is cached never calls the export, so the build file's gate keys are checked
    where the plan is read, warm cache or cold; `build.reproducible` says it is the format's declared row."""
    from edgex.build.reproducible import reproducibility

    file = tmp_path / "gates.toml"
    file.write_text('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu"]\ncomponents = ["talker_decode"]\nmin_db = { talkr = 30 }\n')
    with pytest.raises(EdgexError, match="entry 1: --min-db talkr=...: 'talkr' is no role"):
        load_plan(file)
    file.write_text('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu"]\ncomponents = ["talker_decode"]\nmin_db = { talker = 30 }\n')
    assert load_plan(file).jobs[0].gate_db == 30.0
    assert "not measured for this artifact" in reproducibility("onnx")["basis"]


def test_the_ci_build_holds_every_model_on_every_target_family_that_places_it():
    """`builds/ci.toml` is the default matrix: every recipe at the tiny preset on every target family
    (the HTP phones share one path: s25-htp stands for them) where the target places any of its
    components by default, each pair planning jobs, so a change that breaks one default shows in CI."""
    from edgex.recipes import RECIPES
    from edgex.targets import TARGETS

    families = [t for name, t in TARGETS.items() if not name.endswith("-htp") or name == "s25-htp"]
    placed = {(model, target.name) for model, facts in RECIPES.all_facts() for target in families
              if any(p.precisions for c in facts.components for p in facts.placements_on(target, c))}
    assert {"cpu", "mnn", "s25-htp", "apple", "llama-cpp"} <= {t.name for t in families}
    ci = load_plan(Path(__file__).resolve().parent.parent / "builds" / "ci.toml")
    assert {(j.model, j.target) for j in ci.jobs} == placed
    assert {j.preset for j in ci.jobs} == {"tiny"} and not any(j.placements for j in ci.jobs)
