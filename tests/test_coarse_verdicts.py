"""A scheme its recipe declares too coarse for a component, built because the user asked for it by
name, passes as "pass (coarse)" wherever its verdict is read: the manifest entry `edgex export`
writes, `edgex verify`'s row, the status, the export and build tables, JUnit and the build
summaries, the sweep's rows (JSON, CSV, Markdown, picture) and `edgex pipeline`'s choice of stages.
A sweep never recommends such a point unless `--allow-coarse`, and says which points it left out
and why. On toy components and recorded entries: no export runs here."""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console
from torch import nn

import edgex.export
import edgex.verify
from noisy_scheme import NoisyScheme, noisy
from edgex.build.report import junit_xml, summary_json, summary_markdown
from edgex.component import Component, TensorSpec
from edgex.in_situ import _choose
from edgex.parity.runtimes.base import Session
from edgex.parity.scheme import measure_split
from edgex.recipes import RECIPES
from edgex.render import summary_table, verify_table
from edgex.status import status
from edgex.sweep.recommend import recommend
from edgex.sweep.report import placement_line, write
from edgex.sweep.run import _row

SHAPE = (4, 256)
COARSE_PASS = "pass (coarse)"
REASON = "int4 weights alone flip the decode step's top-1 token beyond the tie margin"


class _Run(Session):
    def __init__(self, fn):
        self.fn = fn

    def run(self, inputs):
        return self.fn(inputs)


def _coarse_report():
    """A 3 dB scheme (the band broken graphs score in) lowered faithfully (40 dB against 30): asked
    for by name, its lowering alone decides, and it passes."""
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    component = Component("decode", "llm", nn.Identity(), [TensorSpec("x", SHAPE, "float32")],
                          [TensorSpec("y", SHAPE, "float32")], lambda x: (2 * x,), {"s": (x,)})
    scheme = NoisyScheme(component, 3.0)
    artifact = _Run(lambda inputs: noisy([t.numpy() for t in scheme(tuple(torch.from_numpy(a) for a in inputs))], 40.0, seed=2))
    return measure_split(component, artifact, "coreml", "float32", 5.0, 30.0, scheme, "simulated", "toy", accepted=REASON)


def _entry(tmp_path: Path, monkeypatch, coarse: str | None, name: str = "decode.w4.mlpackage") -> dict:
    """An entry as `edgex export` gates and places it (`_gate_and_place`), its parity the toy's."""
    report = _coarse_report()
    assert report.verdict == "pass" and report.waived, report.failures
    monkeypatch.setattr(edgex.export, "parity_in", lambda *args, **kwargs: report)
    stage = tmp_path / "stage"
    (stage / ".job").mkdir(parents=True, exist_ok=True)
    file = stage / ".job" / name
    file.write_bytes(b"artifact")
    entry = {"component": "decode", "role": "llm", "format": "mlpackage", "exporter": "coreml", "backend": "mlprogram",
             "precision": "w4", "inputs": [{"name": "x", "shape": list(SHAPE), "dtype": "float32"}], "outputs": [],
             "io_float_dtype": "float32", **({"coarse_scheme": coarse} if coarse else {})}
    return edgex.export._gate_and_place(entry, None, [file], "coreml", None, "w4", {}, None, None, stage, None, coarse)


def test_export_marks_a_passing_coarse_entry_and_places_it_with_the_passes(tmp_path, monkeypatch):
    coarse = _entry(tmp_path, monkeypatch, REASON)
    assert coarse["verdict"] == COARSE_PASS and coarse["coarse_scheme"] == REASON
    assert coarse["files"][0]["path"] == "decode.w4.mlpackage", "a pass: not under failed/ or unverified/"
    assert coarse["gate"]["figure"] == "lowering", "the lowering decided; the scheme's failures are waived"
    assert status([coarse]) == "pass"
    plain = _entry(tmp_path, monkeypatch, None, "decode.w8.mlpackage")
    assert plain["verdict"] == "pass"


def _text(table) -> str:
    console = Console(width=250, record=True)
    console.print(table)
    return console.export_text()


def test_the_tables_junit_and_build_summaries_say_pass_coarse(tmp_path, monkeypatch):
    entry = _entry(tmp_path, monkeypatch, REASON)
    manifest = {"model": "spark-x2.5", "target": "apple", "source": {"preset": "tiny"}, "status": status([entry]),
                "artifacts": [entry]}
    assert "pass (coarse)" in _text(summary_table(manifest))
    artifact = {**entry, "id": "spark-x2.5/apple/decode.w4.mlpackage", "folder": "spark-x2.5/apple",
                "build": {"key": "k", "reused": False, "seconds": 1.0, "export_seconds": 1.0, "reproducible": None}}
    root = ET.fromstring(junit_xml({"seconds": 1.0}, [artifact]))
    case = root.find("testsuite/testcase")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["verdict"] == COARSE_PASS and props["coarse_scheme"] == REASON
    assert case.find("failure") is None and case.find("system-out").text.startswith(f"{COARSE_PASS}: ")
    summary = summary_json({"status": "pass", "seconds": 1.0, "jobs": 1}, [artifact])
    assert summary["counts"][COARSE_PASS] == 1 and summary["counts"]["pass"] == 0
    text = summary_markdown(summary)
    assert f"🔶 {COARSE_PASS}" in text and "1 pass (coarse)" in text and f"`{artifact['id']}`: {REASON}" in text


def test_verify_reruns_a_coarse_entry_and_says_pass_coarse(tmp_path, monkeypatch):
    report = _coarse_report()
    monkeypatch.setattr(edgex.verify, "parity_in", lambda *args, **kwargs: report)
    monkeypatch.setattr(edgex.verify, "tensor_parity", lambda *args, **kwargs: None)
    monkeypatch.setattr(edgex.verify, "quantized_parity", lambda *args, **kwargs: None)
    entry = {"component": "decode", "format": "mlpackage", "exporter": "coreml", "precision": "w4", "io_float_dtype": "float32",
             "parity": {"threshold_db": 5.0}, "coarse_scheme": REASON}
    row = edgex.verify._rerun(entry, None, [], {}, None, [], REASON)
    assert row["verdict"] == COARSE_PASS and row["coarse_scheme"] == REASON and row["gate"]["figure"] == "lowering"
    row.update(component="decode", format="mlpackage", precision="w4", files="ok", problem="")
    assert "pass (coarse)" in _text(verify_table({"manifest": "m", "status": status([row]), "artifacts": [row]}))
    strict = edgex.verify._rerun({**entry, "coarse_scheme": None}, None, [], {}, None, [], None)
    assert strict["verdict"] == "pass" and "coarse_scheme" not in strict


def _rows(tmp_path, monkeypatch) -> list[dict]:
    """Sweep rows of one component as `edgex sweep` reads them back from its manifests: a coarse w4
    point, smaller, and a w8 point."""
    coarse = _entry(tmp_path, monkeypatch, REASON)
    plain = {**coarse, "precision": "w8", "verdict": "pass", "files": [{**coarse["files"][0], "bytes": 5000}]}
    plain.pop("coarse_scheme")
    build = {"build": {"export_seconds": 1.0, "reused": False}, "folder": "spark-x2.5/apple"}
    return [_row({**coarse, **build}, tmp_path, None), _row({**plain, **build}, tmp_path, None)]


def test_a_sweep_leaves_coarse_points_out_of_its_recommendation_and_says_so(tmp_path, monkeypatch):
    rows = _rows(tmp_path, monkeypatch)
    assert [r["verdict"] for r in rows] == [COARSE_PASS, "pass"] and rows[0]["bytes"] < rows[1]["bytes"]
    result = recommend(rows, (), placement_line, None)
    assert result["chosen"]["decode"]["precision"] == "w8", "bytes would pick w4: it is ruled out"
    assert result["left_out"] == [{"point": "decode=coreml:w4", "reason": f"{COARSE_PASS}: {REASON}"}]
    out = tmp_path / "sweep"
    out.mkdir()
    pictures = []
    summary = write(out, "spark-x2.5", "apple", {"rows": rows, "status": "pass", "build": {"seconds": 1.0}},
                    lambda *args: pictures.append(args), result)
    assert summary["recommendation"] == {"decode": "decode=coreml:w8"} and summary["left_out"] == result["left_out"]
    saved = json.loads((out / "sweep.json").read_text())
    assert [(r["precision"], r["verdict"], r["coarse_scheme"]) for r in saved["rows"]] == [("w4", COARSE_PASS, REASON), ("w8", "pass", None)]
    assert saved["pareto"] == {"decode": [1]}, "the front holds the candidates only"
    with open(out / "sweep.csv") as f:
        table = list(csv.DictReader(f))
    assert [(r["precision"], r["verdict"], r["coarse_scheme"]) for r in table] == [("w4", COARSE_PASS, REASON), ("w8", "pass", "")]
    markdown = (out / "sweep.md").read_text()
    assert f"| {COARSE_PASS} |" in markdown and f"- decode=coreml:w4: {COARSE_PASS}: {REASON}" in markdown
    placement = (out / "recommended.placement").read_text()
    assert f"# left out: decode=coreml:w4 ({COARSE_PASS}: {REASON})" in placement and "--allow-coarse admits them" in placement
    assert [line for line in placement.splitlines() if not line.startswith("#")][0].startswith("decode=coreml:w8")

    allowed = recommend(rows, (), placement_line, None, allow_coarse=True)
    assert allowed["chosen"]["decode"]["precision"] == "w4" and allowed["left_out"] == []


def test_the_sweep_picture_draws_a_coarse_point_apart(tmp_path, monkeypatch):
    """The coarse point is drawn hollow and labelled so: neither a pass (filled) nor a failure (a red cross)."""
    from matplotlib.axes import Axes

    from edgex.sweep.plot import plot

    drawn, labels = [], []
    scatter, annotate = Axes.scatter, Axes.annotate
    monkeypatch.setattr(Axes, "scatter", lambda ax, *a, **k: drawn.append(k) or scatter(ax, *a, **k))
    monkeypatch.setattr(Axes, "annotate", lambda ax, text, *a, **k: labels.append(text) or annotate(ax, text, *a, **k))
    rows = _rows(tmp_path, monkeypatch)
    plot(tmp_path / "sweep.png", "coarse", rows, {"decode": [1]})
    assert (tmp_path / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "mlpackage w4 (pass, coarse)" in labels and "mlpackage w8" in labels
    coarse, plain = drawn[:2]
    assert coarse.get("facecolors") == "none" and coarse.get("marker") != "x" and "facecolors" not in plain


def test_a_pipeline_stage_may_be_a_coarse_pass_placed_by_name(tmp_path, monkeypatch):
    """`edgex pipeline --placement decode=coreml:w4` serves the stage with the coarse pass (a failed
    one is refused); the pipeline's own verdict then says pass (coarse) (`edgex.in_situ`)."""
    entry = _entry(tmp_path, monkeypatch, REASON)
    manifest = {"target": "apple", "artifacts": [entry]}
    chosen = _choose([(tmp_path / "stage", manifest)], RECIPES.facts("spark-x2.5"), ["decode"], ["decode=coreml:w4"])
    assert chosen["decode"][1] is entry
    with pytest.raises(Exception, match="did not pass its gate"):
        _choose([(tmp_path, {"target": "apple", "artifacts": [{**entry, "verdict": "fail"}]})], RECIPES.facts("spark-x2.5"),
                ["decode"], ["decode=coreml:w4"])
    from edgex.in_situ import pipeline_verdict

    assert pipeline_verdict([], {"decode": entry, "prefill": {"verdict": "pass"}}) == (COARSE_PASS, {"decode": REASON})
    assert pipeline_verdict(["free-running tokens differ"], {"decode": entry}) == ("fail", {"decode": REASON})
    assert pipeline_verdict([], {"prefill": {"verdict": "pass"}}) == ("pass", {})
