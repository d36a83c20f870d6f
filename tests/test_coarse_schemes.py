"""Schemes a recipe declares too coarse for a component (`RecipeFacts.coarse`): never placed by
default, built when asked for by name with a warning and a manifest record, and then judged by
their lowering alone; a broken lowering and a NaN still fail."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from conftest import run_cli
from noisy_scheme import NoisyScheme, noisy
from edgex.component import LOGITS, Component, TensorSpec
from edgex.parity.check import tie_margin
from edgex.parity.runtimes.base import Session
from edgex.parity.scheme import measure_split
from edgex.plan import coarse_warning, plan
from edgex.recipes import RECIPES
from edgex.targets import get_target

SHAPE = (4, 256)


def _facts(**coarse):
    return replace(RECIPES.facts("spark-x2.5"), coarse=coarse)


def test_a_coarse_scheme_is_left_out_of_the_defaults_and_built_when_asked_for_by_name():
    facts = _facts(decode={"w4": "scheme top-1 0.00"})
    apple = get_target("apple")
    placed = {(j.component, j.precision) for j in plan(facts, apple, None, None, None)}
    assert ("decode", "w4") not in placed and {("decode", "w8"), ("prefill", "w4")} <= placed
    (asked,) = [j for j in plan(facts, apple, ["decode"], None, ["w4"]) if j.precision == "w4"]
    assert asked.coarse == "scheme top-1 0.00"
    assert "decode coreml:w4 is built on request only: scheme top-1 0.00" in coarse_warning("spark-x2.5", asked)
    placed_by_user = apple.with_overrides({"decode": (replace(apple.placements_for("llm")[0], precisions=("w4",)),)})
    assert [(j.precision, j.coarse) for j in plan(facts, placed_by_user, ["decode"], None, None)] == [("w4", "scheme top-1 0.00")]
    # a precision not declared coarse carries nothing
    assert all(j.coarse is None for j in plan(facts, apple, ["prefill"], None, ["w4"]))


class _Run(Session):
    def __init__(self, fn):
        self.fn = fn

    def run(self, inputs):
        return self.fn(inputs)




def _toy() -> Component:
    x = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0))
    return Component("toy", "llm", nn.Identity(), [TensorSpec("x", SHAPE, "float32")], [TensorSpec("y", SHAPE, "float32")],
                     lambda x: (2 * x,), {"s": (x,)})


@pytest.mark.parametrize("lowering_db, nan, verdict", [(40.0, False, "pass"), (3.0, False, "fail"), (40.0, True, "fail")])
def test_an_accepted_coarse_scheme_is_judged_by_its_lowering(lowering_db, nan, verdict):
    """A 3 dB scheme (in the broken band) against a 5 dB gate: its scheme and end-to-end failures are
    waived when the scheme was asked for by name; a broken lowering (3 dB against 30) and a NaN are not."""
    component = _toy()
    scheme = NoisyScheme(component, 3.0)

    def artifact(inputs):
        out = noisy([t.numpy() for t in scheme(tuple(torch.from_numpy(x) for x in inputs))], lowering_db, seed=2)
        if nan:
            out[0][0, 0] = np.nan
        return out

    strict = measure_split(component, _Run(artifact), "toy", "float32", 5.0, 30.0, scheme)
    assert strict.verdict == "fail" and strict.waived == []
    report = measure_split(component, _Run(artifact), "toy", "float32", 5.0, 30.0, scheme, accepted="declared coarse")
    assert report.verdict == verdict, report.failures
    assert report.waived and all(w.startswith(("end-to-end: min SNR", "scheme: min SNR")) for w in report.waived)
    assert report.scheme["verdict"] == "fail" and report.gate["figure"] == "lowering"
    if nan:
        assert "NaN" in report.failures[0]


def test_spark_decode_core_ml_w4_is_no_default_on_apple_and_asking_for_it_warns(tmp_path):
    """Core ML w4 flips Spark-X2.5 decode's token beyond the tie margin (scheme 6.6 dB, top-1 0.00):
    `apple` places fp16 and w8 only; `-p w4` plans it with one warning line and the reason in the plan."""
    default = json.loads(run_cli("export", "spark-x2.5", "--target", "apple", "-c", "decode", "--dry-run", "--json",
                                 "--out", str(tmp_path)).stdout)
    assert {j["precision"] for j in default["jobs"]} == {"fp16", "w8"}
    asked = run_cli("export", "spark-x2.5", "--target", "apple", "-c", "decode", "-p", "w4", "--dry-run", "--json",
                    "--out", str(tmp_path))
    assert asked.returncode == 0, asked.stderr
    reason = RECIPES.facts("spark-x2.5").coarse_reason("decode", "w4")
    assert "6.6 dB" in reason and "top-1 0.00" in reason
    assert [line for line in asked.stderr.splitlines() if line.strip()] == [
        f"warning: spark-x2.5 decode coreml:w4 is built on request only: {reason}; its scheme and end-to-end figures "
        "are reported, its lowering alone decides the verdict"]
    assert [j.get("coarse_scheme") for j in json.loads(asked.stdout)["jobs"]] == [reason]


def _logits_case(ratio: float):
    """fp32 logits whose best two lie `ratio` x the 30 dB tie margin apart; a scheme that closes half
    the gap, and an artifact that closes the rest and a hair more: the artifact picks the runner-up."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 64, generator=gen) * 0.3
    logits[0, 0] = 1.0
    gap = ratio * tie_margin(30.0, logits.numpy()[0])
    logits[0, 1] = 1.0 - gap
    component = Component("head", "llm", nn.Identity(), [TensorSpec("x", (1, 1), "float32")],
                          [TensorSpec("logits", (1, 64), "float32", LOGITS)], lambda x: (logits.clone(),), {"s": (torch.zeros(1, 1),)})
    scheme_out = logits.clone()
    scheme_out[0, 1] += 0.5 * gap
    artifact_out = scheme_out.clone()
    artifact_out[0, 1] += 0.51 * gap

    class Scheme:
        label = "toy scheme"

        def __call__(self, inputs, forced=None):
            return (scheme_out.clone(),)

        def to_json(self):
            return {"source": self.label}

    return component, Scheme(), _Run(lambda inputs: [artifact_out.numpy()])


@pytest.mark.parametrize("ratio, verdict", [(1.2, "pass"), (3.0, "fail")])
def test_the_end_to_end_figure_judges_flips_at_two_errors_tie_level(ratio, verdict):
    """Scheme and lowering each move the runner-up by half the gap (ties in their own figures at
    30 dB); end to end the flip is `ratio` x the 30 dB margin: the sum of two tie-level errors
    (1.2 x) is a tie at 27 dB, a 3 x flip is not."""
    component, scheme, session = _logits_case(ratio)
    report = measure_split(component, session, "toy", "float32", 20.0, 30.0, scheme)
    (flip,) = report.divergences
    assert flip["tie_db"] == pytest.approx(30.0 - 10 * math.log10(2))
    assert flip["margin"] / flip["tie_margin"] * math.sqrt(2) == pytest.approx(ratio, rel=0.1)  # x the 30 dB margin
    assert flip["tie"] == (verdict == "pass") and report.scheme["divergences"] == []
    assert report.verdict == verdict, report.failures
