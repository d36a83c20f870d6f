"""`edgex build`: a build file to one tree + JUnit, the cache, shards + merge, reproducibility.

One small matrix (the talker step on cpu / llama-cpp / s25-htp, one format and precision each: ONNX,
GGUF, and QNN with its .dlc; and the Spark-X2.5 decode step on cpu, with a gate it fails on purpose)
is built once, rebuilt from the cache, and built again as two shards with their own empty caches:
the shards re-export every artifact in other processes, so comparing their hashes with the first
build measures which formats export reproducibly."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from conftest import ONE_JOB_BUILD, cli_here, run_cli
from edgex.build.reproducible import MEASURED

pytestmark = pytest.mark.xdist_group("build")

BUILD_FILE = ONE_JOB_BUILD.replace('["fp32"]', '["fp16"]') + """
[[entry]]
model = "qwen3-tts"
targets = ["llama-cpp"]
components = ["talker_decode"]
precisions = ["f16"]

[[entry]]
model = "qwen3-tts"
targets = ["s25-htp"]
components = ["talker_decode"]

[[entry]]
model = "spark-x2.5"
targets = ["cpu"]
components = ["decode"]
formats = ["onnx"]
precisions = ["fp16"]
min_db = 200            # on purpose: no fp16 graph reaches 200 dB, so this artifact fails its gate
"""
FAILING = "spark-x2.5/cpu/decode.fp16.onnx"


def build(*args: str, here: bool = False) -> tuple[int, dict | None, str]:
    """`edgex build ARGS --json` in a process of its own, or in this one (`here`: a run that exports
    nothing, so no process of its own has anything to show)."""
    proc = (cli_here if here else run_cli)("build", *args, "--json")
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        data = None
    return proc.returncode, data, proc.stderr


def digest(data: dict) -> dict:
    """What must agree between two builds of one plan: artifact set, file hashes, verdicts."""
    return {a["id"] + ("" if "sidecar_of" not in a else "#" + a["format"]):
            (a["verdict"], sorted((f["path"], f["sha256"]) for f in a["files"])) for a in data["artifacts"]}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    root = tmp_path_factory.mktemp("build")
    file = root / "ci.toml"
    file.write_text(BUILD_FILE)
    runs = {"first": build(str(file), "--out", str(root / "out")),
            "again": build(str(file), "--out", str(root / "out"), here=True)}  # every artifact from the cache
    for i in (1, 2):  # each shard with an empty cache of its own: every artifact exported again
        runs[f"shard{i}"] = build(str(file), "--out", str(root / f"shard{i}"), "--shard", f"{i}/2",
                                  "--cache", str(root / f"cache{i}"))
    runs["merged"] = build("merge", str(root / "shard1"), str(root / "shard2"), "--out", str(root / "merged"), here=True)
    return root, runs


def test_build_writes_a_junit_report_with_the_forced_failure(builds):
    root, runs = builds
    rc, data, stderr = runs["first"]
    assert rc == 1, stderr[-3000:]  # one gate failed on purpose
    assert "build fail: " in stderr and f"{FAILING} (fail)" in stderr, stderr[-2000:]
    assert {a["id"] for a in data["artifacts"]} >= {
        "qwen3-tts/cpu/talker_decode.fp16.onnx", "qwen3-tts/llama-cpp/talker_decode.f16.gguf",
        "qwen3-tts/s25-htp/talker_decode.fp16.qnn", FAILING}
    suites = ET.parse(root / "out" / "junit.xml").getroot()
    cases = {f"{c.get('classname')}::{c.get('name')}": c for c in suites.iter("testcase")}
    assert int(suites.get("tests")) == len(cases) == len(data["artifacts"])
    assert suites.get("failures") == "1" and suites.get("errors") == "0"
    failure = cases["edgex.spark-x2.5.cpu::decode.fp16.onnx"].find("failure")
    artifact = next(a for a in data["artifacts"] if a["id"] == FAILING)
    measured = artifact["parity"]["min_snr_db"]
    assert failure.get("message") == f"min SNR {measured:.1f} dB, required 200.0 dB (runtime)"
    assert "FAIL" in failure.text and "(required 200.0 dB)" in failure.text
    passing = [c for k, c in cases.items() if "spark-x2.5.cpu" not in k]
    assert passing and all(c.find("failure") is None and c.find("error") is None for c in passing)
    # the tree: per-folder manifests edgex verify reads; the failing file under failed/
    manifest = json.loads((root / "out" / "spark-x2.5" / "cpu" / "manifest.json").read_text())
    assert manifest["status"] == "fail" and manifest["artifacts"][0]["files"][0]["path"].startswith("failed/")
    for a in data["artifacts"]:
        for record in a["files"]:
            assert (root / "out" / a["folder"] / record["path"]).is_file()
    summary = (root / "out" / "summary.md").read_text()
    assert summary.startswith("## edgex build: FAIL") and f"`{FAILING}` | ❌ fail" in summary


def test_rebuild_reuses_every_artifact(builds):
    _, runs = builds
    (rc1, first, _), (rc2, again, stderr) = runs["first"], runs["again"]
    assert rc2 == rc1 == 1, stderr[-2000:]
    assert all(a["build"]["reused"] for a in again["artifacts"])
    assert digest(again) == digest(first)
    assert again["build"]["seconds"] < first["build"]["seconds"] / 5
    print(f"first build {first['build']['seconds']:.1f} s, rebuild from the cache {again['build']['seconds']:.1f} s")


def test_shards_merge_to_the_unsharded_build(builds):
    root, runs = builds
    first = runs["first"][1]
    ids = [set(runs[f"shard{i}"][1]["build"]["shard"]["ids"]) for i in (1, 2)]
    assert ids[0] and ids[1] and not ids[0] & ids[1] and ids[0] | ids[1] == set(first["build"]["plan_ids"])
    rc, merged, stderr = runs["merged"]
    assert rc == 1, stderr[-2000:]
    assert [a["id"] for a in merged["artifacts"]] == [a["id"] for a in first["artifacts"]]
    assert not any(a["build"]["reused"] for a in merged["artifacts"])
    expected, got = digest(first), digest(merged)
    assert {k: v[0] for k, v in got.items()} == {k: v[0] for k, v in expected.items()}  # verdicts
    for key in expected:  # hashes, where the format rebuilds to the same bytes (test below)
        if MEASURED[key.split(".")[-1].split("#")[0]][0]:
            assert got[key] == expected[key], key
    suites = ET.parse(root / "merged" / "junit.xml").getroot()
    assert suites.get("tests") == str(len(merged["artifacts"])) and suites.get("failures") == "1"


def test_reproducibility_table_matches_a_rebuild(builds):
    """The shards re-exported every artifact in other processes with empty caches: a format whose
    table row says deterministic must give the same sha256, one that says not must differ."""
    _, runs = builds
    first, merged = digest(runs["first"][1]), digest(runs["merged"][1])
    for key in first:
        exporter = next(a["exporter"] for a in runs["first"][1]["artifacts"] if a["id"] == key.split("#")[0])
        deterministic, why = MEASURED[exporter]
        assert (first[key][1] == merged[key][1]) == deterministic, (key, why)
    assert all(a["build"]["reproducible"]["deterministic"] is MEASURED[a["exporter"]][0] for a in runs["first"][1]["artifacts"])


def test_published_onnx_models_load_with_their_external_data(builds):
    """A build publishes by hard links into its cache, except ONNX external data: ONNX's loader
    refuses a `.onnx.data` with more than one link ("potential hardlink attack"), so `onnx.load` of a
    published model, and `edgex verify` of the folder, would fail."""
    import os

    import onnx

    root, runs = builds
    assert runs["first"][0] == 1, runs["first"][2][-2000:]
    models = [p for tree in ("out", "merged") for p in (root / tree).rglob("*.onnx") if ".edgex-cache" not in p.parts]
    data = [p for p in models if p.with_name(p.name + ".data").is_file()]
    assert data, models
    for model in data:
        assert os.stat(model.with_name(model.name + ".data")).st_nlink == 1, model
        onnx.load(str(model))  # with its external data
