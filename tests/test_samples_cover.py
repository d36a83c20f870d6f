"""Parity samples cover what runners do: the talker decode's last KV slot (at any `--set
max_context`) and a cache whose ignored slots hold stale values; step graphs mid-trajectory.

Each planted bug sits where the samples used to not look: a talker whose RoPE is wrong only beyond
slot 100 (its samples were at positions 26 and 46), a denoise step wrong only between the first and
last timestep (its samples were at those two). The faithful graphs pass."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from edgex.cli import app

pytestmark = pytest.mark.xdist_group("samples_cover")


def _export(tmp_path, model: str, component: str, *args: str) -> dict:
    result = CliRunner().invoke(app, ["export", model, "--preset", "tiny", "-c", component, "-f", "onnx", "-p", "fp32", *args,
                                      "--out", str(tmp_path), "--json"])
    (entry,) = json.loads(result.stdout)["artifacts"]
    assert result.exit_code == (0 if entry["verdict"] == "pass" else 1), result.output[-3000:]
    return entry


def _failed_samples(entry: dict) -> set[str]:
    """Samples with an output under the gate."""
    parity = entry["parity"]
    return {sample for sample, outputs in parity["samples"].items()
            if any(float(o[k]) < parity["threshold_db"] for o in outputs.values() for k in ("snr_db", "copied_snr_db") if k in o)}


def test_a_talker_with_rope_wrong_beyond_slot_100_fails_at_max_context_128(monkeypatch, tmp_path):
    from edgex.recipes.qwen3_tts import talker

    faithful = _export(tmp_path / "faithful", "qwen3-tts", "talker_decode", "--set", "max_context=128")
    assert faithful["verdict"] == "pass", faithful["parity"]["failures"]
    samples = faithful["parity"]["samples"]
    assert set(samples) == {"utterance_a_frame10", "utterance_b_frame30", "utterance_a_frame39_stale_slots",
                            "utterance_b_frame111_last_slot"}
    assert faithful["inputs"][2]["shape"][3] == 128

    rope = talker.rope_cos_sin

    def off_beyond_100(module, name, positions, dtype):  # 3 positions back: the table ends at the last slot
        return rope(module, name, torch.where(positions > 100, positions - 3, positions), dtype)

    monkeypatch.setattr(talker, "rope_cos_sin", off_beyond_100)
    broken = _export(tmp_path / "broken", "qwen3-tts", "talker_decode", "--set", "max_context=128")
    assert broken["verdict"] == "fail"
    assert _failed_samples(broken) == {"utterance_b_frame111_last_slot"}, broken["parity"]["failures"]
    for sample, scores in broken["parity"]["samples"].items():  # the rest is untouched
        if sample != "utterance_b_frame111_last_slot":
            assert float(scores["key"]["snr_db"]) >= 100, (sample, scores["key"])
    print(f"last slot key: faithful {float(samples['utterance_b_frame111_last_slot']['key']['snr_db']):.1f} dB, "
          f"broken {float(broken['parity']['samples']['utterance_b_frame111_last_slot']['key']['snr_db']):.1f} dB")


def test_a_denoise_step_wrong_only_mid_trajectory_fails(monkeypatch, tmp_path):
    """Tiny Diffusion Policy, 4 DDIM steps: timesteps 75, 50, 25, 0. The planted graph embeds every
    timestep strictly between 0 and 75 as 10 more."""
    from edgex.recipes.diffusion_policy import graphs

    faithful = _export(tmp_path / "faithful", "diffusion-policy", "denoise_step")
    assert faithful["verdict"] == "pass" and set(faithful["parity"]["samples"]) == {"obs_a_first", "obs_b_last", "obs_c_step2"}

    forward = graphs.DiffusionStep.forward

    def wrong_mid_trajectory(self, sample, timestep, global_cond):
        middle = (timestep > 0) & (timestep < 75)
        return forward(self, sample, torch.where(middle, timestep + 10, timestep), global_cond)

    monkeypatch.setattr(graphs.DiffusionStep, "forward", wrong_mid_trajectory)
    broken = _export(tmp_path / "broken", "diffusion-policy", "denoise_step")
    assert broken["verdict"] == "fail" and _failed_samples(broken) == {"obs_c_step2"}, broken["parity"]["failures"]


def _rope_off_beyond(module, slot: int):
    """`module.rope_cos_sin` with every position beyond `slot` turned 3 positions back (the table
    holds no row beyond the last slot)."""
    rope = module.rope_cos_sin

    def off(owner, name, positions, dtype):
        return rope(owner, name, torch.where(positions > slot, positions - 3, positions), dtype)

    return off


@pytest.mark.parametrize("model, component, module, slots, broken_beyond, samples", [
    # Spark-X2.5 tiny holds 128 slots unless told: 160 reaches past them
    ("spark-x2.5", "decode", "edgex.recipes.spark_x25.graphs", 160, 130,
     {"prompt_a_pos159_last_slot", "prompt_b_pos7", "prompt_a_pos73_stale_slots"}),
    # MiniCPM-o tiny's head holds 64 slots unless told
    ("minicpm-o", "tts_decode", "edgex.recipes.minicpm_o.tts", 128, 100,
     {"utterance_a_step3", "utterance_b_step11", "utterance_b_step0", "utterance_a_step56_stale_slots",
      "utterance_b_step113_last_slot"}),
])
def test_a_decode_graph_with_rope_wrong_beyond_a_late_slot_fails_at_a_larger_max_context(monkeypatch, tmp_path, model, component,
                                                                                        module, slots, broken_beyond, samples):
    import importlib

    faithful = _export(tmp_path / "faithful", model, component, "--set", f"max_context={slots}")
    assert faithful["verdict"] == "pass", faithful["parity"]["failures"]
    assert set(faithful["parity"]["samples"]) == samples
    assert {s["name"]: s["shape"] for s in faithful["inputs"]}["past_key"][3] == slots
    (last,) = (s for s in samples if s.endswith("_last_slot"))

    graphs = importlib.import_module(module)
    monkeypatch.setattr(graphs, "rope_cos_sin", _rope_off_beyond(graphs, broken_beyond))
    broken = _export(tmp_path / "broken", model, component, "--set", f"max_context={slots}")
    assert broken["verdict"] == "fail"
    assert _failed_samples(broken) == {last}, broken["parity"]["failures"]
    print(f"{model} {component} last slot: faithful {float(faithful['parity']['samples'][last]['logits']['snr_db']):.1f} dB, "
          f"broken {float(broken['parity']['samples'][last]['logits']['snr_db']):.1f} dB")
