"""fp16 accumulation: its emulation sums as an fp16 accumulator does, and the gates it sets stay
between the floor's allowance and `HALF_ARITHMETIC_MIN_DB`, never where the user set them."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgex.parity.gates import HALF_ARITHMETIC_MIN_DB, half_arithmetic_db
from edgex.parity.half_arithmetic import HalfAccumulation, half_arithmetic_gates
from edgex.recipes import RECIPES


def test_products_are_summed_in_an_fp16_accumulator():
    """4096 ones: an fp16 running sum stops at 2048 (2048 + 1 rounds back to 2048); a bias starts
    the sum; other dtypes are untouched."""
    ones = torch.ones(2, 4096, dtype=torch.float16)
    column = torch.ones(4096, 3, dtype=torch.float16)
    with HalfAccumulation():
        summed = ones @ column
        biased = F.linear(ones, column.T, torch.full((3,), 1024.0, dtype=torch.float16))
        batched = torch.bmm(ones[None], column[None])
        full = ones.float() @ column.float()
    assert summed.dtype == torch.float16 and torch.all(summed == 2048)
    assert torch.all(biased == 2048) and torch.all(batched == 2048)
    assert torch.all(full == 4096) and torch.all(ones @ column == 4096)


class _HalfRuntime:
    name = "a runtime"

    def accumulates_in_half(self):
        return True


def test_gates_follow_the_floor_within_their_bounds_and_leave_a_users_gate_alone():
    assert half_arithmetic_db(30.0, 29.0) == 23.0
    assert half_arithmetic_db(30.0, 60.0) == 30.0
    assert half_arithmetic_db(30.0, 12.0) == HALF_ARITHMETIC_MIN_DB
    recipe = RECIPES.get("spark-x2.5")
    (comp,) = recipe.components(recipe.load("tiny", None, 0), ["decode"])
    gates = half_arithmetic_gates(comp, _HalfRuntime(), "fp16", None, 30.0, 30.0)
    assert 35 < gates["floor_db"] < 60 and gates["end_to_end_gate_db"] == gates["lowering_gate_db"] <= 30.0
    assert "note" not in gates
    kept = half_arithmetic_gates(comp, _HalfRuntime(), "fp16", {"fp16": 45.0, "lowering": 50.0}, 45.0, 50.0)
    assert kept["end_to_end_gate_db"] == 45.0 and kept["lowering_gate_db"] == 50.0
    assert half_arithmetic_gates(comp, _HalfRuntime(), "8da8w", None, 15.0, 30.0) is None


def test_a_floor_near_the_broken_band_sets_the_minimum_gate_and_says_why(monkeypatch):
    """The Spark-X2.5 1.7b preset's decode (random weights, 28 layers at hidden 2048) has an 18.5 dB
    floor: its gates stop at `HALF_ARITHMETIC_MIN_DB`, and the record says fp16 is too coarse there."""
    from types import SimpleNamespace

    from edgex.parity import half_arithmetic

    monkeypatch.setattr(half_arithmetic, "floor_db", lambda component: 18.5)
    gates = half_arithmetic_gates(SimpleNamespace(role="llm"), _HalfRuntime(), "fp16", None, 30.0, 30.0)
    assert gates["end_to_end_gate_db"] == gates["lowering_gate_db"] == HALF_ARITHMETIC_MIN_DB
    assert "18.5 dB" in gates["note"] and "too coarse" in gates["note"]


def test_the_floor_is_measured_only_for_an_artifact_that_fails_its_fixed_gates(monkeypatch, tmp_path):
    """The floor only lowers gates: a faithful fp16 graph that passes the fixed ones is not slowed by
    it (minutes of emulated sums at 0.6b), and says so; a broken one that fails them is re-gated at
    the floor's gates, which fail it still. ONNX fp16 of the tiny Spark-X2.5 decode, its runtime
    made to report fp16 sums."""
    from edgex.export import run_parity
    from edgex.exporters import EXPORTERS
    from edgex.parity import half_arithmetic
    from edgex.parity.runtimes import RUNTIMES
    from planted_graph import plant

    recipe = RECIPES.get("spark-x2.5")
    (comp,) = recipe.components(recipe.load("tiny", None, 0), ["decode"])
    exporter = EXPORTERS.get("onnx")
    monkeypatch.setattr(type(RUNTIMES.get(exporter.runtime)), "accumulates_in_half", lambda self: True)
    floors = []
    monkeypatch.setattr(half_arithmetic, "floor_db", lambda component: floors.append(component) or 29.0)
    result = exporter.export(comp, "fp16", tmp_path / "decode.onnx")
    report = run_parity(comp, exporter, result.files, result.io_float_dtype, "fp16", None, 1)
    assert report.verdict == "pass" and floors == [] and report.threshold_db == 30.0, report.to_json()
    assert report.half_arithmetic == {"accumulation": "fp16", "floor_db": None, "why": half_arithmetic.NOT_MEASURED}
    broken = plant(comp, "head_dropped")
    result = exporter.export(broken, "fp16", tmp_path / "broken.onnx")
    report = run_parity(broken, exporter, result.files, result.io_float_dtype, "fp16", None, 1)
    assert floors == [broken] and report.half_arithmetic["floor_db"] == 29.0
    assert report.verdict == "fail" and report.threshold_db == 23.0, report.to_json()
