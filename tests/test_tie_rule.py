"""The scoring rules of the parity gate on small synthetic components (no export): the tie rule for
flipped tokens and top-1s, teacher forcing on an artifact's own tokens, state outputs scored on the
entries a call writes, and the fails that used to be passes (nothing run, nothing scored)."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from edgex.component import LOGITS, SIGNAL, TOKENS, Component, TensorSpec
from edgex.errors import EdgexError
from edgex.parity import metrics
from edgex.parity.check import flips, measure, tie_margin
from edgex.parity.gates import DEFAULT_DB, check_overrides, parse_overrides, threshold_db
from edgex.parity.runtimes.base import Session
from edgex.precision import PRECISIONS
from edgex.recipes.spark_x25.recipe import WRITTEN

STEPS, VOCAB = 4, 8


def test_near_tie_flip_passes_and_big_margin_flip_fails():
    logits = np.array([[1.0, 0.999, -1.0, 0.5], [1.0, 0.0, -1.0, 0.5]])
    allowed = tie_margin(30.0, logits[0])
    assert allowed == pytest.approx(2 * 10 ** (-1.5) * math.sqrt(np.mean(logits[0] ** 2)))
    near, far = flips(logits, logits, np.array([1, 1]), 30.0)
    assert near["position"] == 0 and near["reference"] == 0 and near["artifact"] == 1
    assert near["margin"] == pytest.approx(0.001) and near["tie"]
    assert far["margin"] == pytest.approx(1.0) and far["margin"] > far["tie_margin"] and not far["tie"]
    # a choice outside the vocabulary is never a tie
    (outside,) = flips(logits[:1], logits[:1], np.array([99]), 30.0)
    assert outside["margin"] == math.inf and not outside["tie"]


def _toy(base, noise, forced=None, override=None):
    """A sampler that feeds its own codes back: step t's logits depend on code t - 1. `forced`
    teacher-forces the codes (the reference); `override` {step: code} makes a sampler that takes
    another code at those steps and then carries on with its own (the artifact)."""
    codes, logits, prev = [], [], 0
    for t in range(STEPS):
        step = base[:, t] + 3.0 * nn.functional.one_hot(torch.tensor([prev]), VOCAB).float()
        if forced is not None:
            code = int(forced["codes"][0, t])
        else:
            code = (override or {}).get(t, int(torch.argmax(step + noise[:, t])))
        codes.append(code)
        logits.append(step)
        prev = code
    return torch.tensor([codes]), torch.stack(logits, dim=1)


def _toy_component(base, noise) -> Component:
    return Component(
        "toy", "predictor", nn.Identity(),
        [TensorSpec("base", (1, STEPS, VOCAB), "float32"), TensorSpec("noise", (1, STEPS, VOCAB), "float32")],
        [TensorSpec("codes", (1, STEPS), "int64", TOKENS, ("logits", "noise")), TensorSpec("logits", (1, STEPS, VOCAB), "float32", LOGITS)],
        lambda b, n: _toy(b, n), {"only": (base, noise)},
        forced_reference=lambda inputs, forced: _toy(*inputs, forced),
    )


class _Run(Session):
    def __init__(self, fn):
        self.fn = fn

    def run(self, inputs):
        return [np.asarray(x) for x in self.fn(*[torch.from_numpy(x) for x in inputs])]


def _bases(step1_gap: float = 0.5, step2_gap: float = 0.2):
    """Step 0 picks code 0. Step 1: the reference's best is 7, code 5 is `step1_gap` behind. Step 2
    (after code 7, which adds 3 to entry 7): entry 7 = 3.0, entry 6 is `step2_gap` behind."""
    base = torch.randn(1, STEPS, VOCAB, generator=torch.Generator().manual_seed(0))
    base[0, 0] = torch.full((VOCAB,), -1.0)
    base[0, 0, 0] = 1.0
    base[0, 1] = torch.linspace(-1.0, 0.0, VOCAB)
    base[0, 1, 5] = -step1_gap
    base[0, 1, 0] = -10.0  # + 3 from code 0: stays off the top
    base[0, 2] = torch.tensor([0.5, -0.5, 0.5, -0.5, 0.5, -0.5, 3.0 - step2_gap, 0.0])
    return base, torch.zeros(1, STEPS, VOCAB)


def _picks_runner_up(base, noise):
    """An artifact whose sampler takes code 5 at step 1 and whose logits are exact for its codes."""
    codes, _ = _toy(base, noise, override={1: 5})
    return _toy(base, noise, {"codes": codes})


def test_a_near_tie_token_flip_passes_and_the_rest_is_scored_teacher_forced():
    base, noise = _bases(step1_gap=1e-4)
    comp = _toy_component(base, noise)
    report = measure(comp, _Run(_picks_runner_up), "toy", "float32", 30.0)
    assert report.verdict == "pass", report.failures
    (flip,) = report.divergences
    assert flip["output"] == "codes" and flip["position"] == 1 and flip["tie"] and flip["teacher_forced"]
    assert flip["reference"] == 7 and flip["artifact"] == 5 and flip["margin"] <= flip["tie_margin"]
    scores = report.samples["only"]
    # the later steps ran on code 5 in both: compared in full, not skipped or truncated
    assert scores["logits"]["snr_db"] == math.inf and scores["codes"]["teacher_forced"]
    free_logits = comp.reference_outputs("only")[1].numpy()
    assert metrics.snr_db(free_logits, _picks_runner_up(base, noise)[1].numpy()) < 30.0


def test_a_big_margin_token_flip_fails_even_with_faithful_logits():
    base, noise = _bases(step1_gap=0.5)
    report = measure(_toy_component(base, noise), _Run(_picks_runner_up), "toy", "float32", 30.0)
    assert report.verdict == "fail"
    assert report.samples["only"]["logits"]["snr_db"] == math.inf  # the logits are exact: the flip alone fails it
    assert report.failures == ["only: codes position 1: artifact 5, reference 7, margin 0.5 > tie margin "
                               f"{report.divergences[0]['tie_margin']:.4g}"]


@pytest.mark.parametrize("gap, verdict", [(0.005, "pass"), (0.2, "fail")])
def test_a_logits_top1_flip_passes_only_as_a_near_tie(gap, verdict):
    """Same codes, step 2's runner-up raised just past the top: the SNR stays above the gate."""
    base, noise = _bases(step2_gap=gap)

    def raised(b, n):
        codes, logits = _toy(b, n)
        logits = logits.clone()
        logits[0, 2, 6] = logits[0, 2, 7] + 0.01
        return codes, logits

    report = measure(_toy_component(base, noise), _Run(raised), "toy", "float32", 30.0)
    assert report.min_snr_db > 30.0
    (flip,) = report.divergences
    assert (flip["output"], flip["position"], flip["reference"], flip["artifact"]) == ("logits", 2, 7, 6)
    assert flip["margin"] == pytest.approx(gap, rel=1e-4) and flip["tie"] == (verdict == "pass")
    assert report.verdict == verdict


def _ring_component(position: int) -> Component:
    """A decode-like call: one token at `position` writes ring slot position % 16."""
    ring = torch.randn(3, 1, 2, 16, 4, generator=torch.Generator().manual_seed(1))
    inputs = (torch.zeros(1, 1, dtype=torch.int64), torch.tensor([position]), ring)

    def reference(tokens, pos, ring_key):
        out = ring_key.clone()
        out[:, :, :, int(pos) % 16] = 1.0 + 0.1 * out[:, :, :, int(pos) % 16]
        return (out,)

    return Component("ring", "llm", nn.Identity(),
                     [TensorSpec("tokens", (1, 1), "int64"), TensorSpec("position", (1,), "int64"), TensorSpec("ring_key", tuple(ring.shape), "float32")],
                     [TensorSpec("next_ring_key", tuple(ring.shape), "float32", SIGNAL)], reference, {"s": inputs},
                     written={"next_ring_key": WRITTEN["next_ring_key"]})


def test_ring_output_is_scored_on_the_slots_the_call_writes():
    comp = _ring_component(position=37)  # slot 5
    ref = comp.reference_outputs("s")[0].numpy()
    broken = ref.copy()
    broken[:, :, :, 5] = ref[:, :, :, 5] * 0.6  # the written slot is wrong (8 dB), the 15 copies are exact
    assert metrics.snr_db(ref, broken) > 15.0 + 5.0  # what whole-ring scoring would have reported
    report = measure(comp, _Run(lambda *_: [broken]), "toy", "float32", 15.0)
    entry = report.samples["s"]["next_ring_key"]
    assert entry["written_entries"] == 3 * 2 * 4 and entry["copied_snr_db"] == math.inf
    assert entry["snr_db"] == pytest.approx(metrics.snr_db(ref[:, :, :, 5], broken[:, :, :, 5]))
    assert report.verdict == "fail" and report.min_snr_db < 15.0
    # and a corrupted copy fails through its own figure
    copy_broken = ref.copy()
    copy_broken[:, :, :, 9] = 0.0
    report = measure(comp, _Run(lambda *_: [copy_broken]), "toy", "float32", 15.0)
    assert report.samples["s"]["next_ring_key"]["snr_db"] == math.inf and report.verdict == "fail"


def test_spark_ring_written_slots_wrap():
    ring = torch.zeros(1, 1, 1, 16, 1)
    (_, _, _, slots) = WRITTEN["next_ring_key"]((torch.zeros(1, 12, dtype=torch.int64), torch.tensor([10]), ring))
    assert sorted(slots.tolist()) == [0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15]


def test_nothing_run_or_nothing_scored_is_a_fail():
    comp = _ring_component(3)
    empty = Component(comp.name, comp.role, comp.module, comp.inputs, comp.outputs, comp.reference, {})
    report = measure(empty, _Run(lambda *_: []), "toy", "float32", 15.0)
    assert report.verdict == "fail" and "no samples" in report.failures[0]
    no_outputs = Component(comp.name, comp.role, comp.module, comp.inputs, [], lambda *x: (), comp.samples)
    report = measure(no_outputs, _Run(lambda *_: []), "toy", "float32", 15.0)
    assert report.verdict == "fail" and "no output was scored" in report.failures[0]


def test_gate_lookup_per_role_and_precision():
    assert set(DEFAULT_DB) == set(PRECISIONS), "every precision has a measured default gate"
    overrides = parse_overrides(["decoder:fp16=40", "decoder=35", "fp16=25", "12"])
    assert threshold_db("decoder", "fp16", overrides) == 40.0
    assert threshold_db("decoder", "fp32", overrides) == 35.0
    assert threshold_db("talker", "fp16", overrides) == 25.0
    assert threshold_db("talker", "fp32", overrides) == 12.0
    assert threshold_db("talker", "fp32") == DEFAULT_DB["fp32"]
    check_overrides(overrides, {"decoder", "talker"})
    for typo in ("decodr=40", "decoder:fp61=40", "fp16:decoder=40"):
        with pytest.raises(EdgexError, match="no role"):
            check_overrides(parse_overrides([typo]), {"decoder", "talker"})


def test_a_flip_under_a_loose_policy_gate_is_judged_at_the_fixed_tie_level():
    """A 5 dB gate would allow flips up to 1.12 x rms(logits) (here 2.8, over the 0.5 margin): the
    tie margin stays the one an error at 30 dB makes, 0.063 x rms(logits), so the flip fails."""
    base, noise = _bases(step1_gap=0.5)
    report = measure(_toy_component(base, noise), _Run(_picks_runner_up), "toy", "float32", 5.0)
    (flip,) = report.divergences
    assert flip["margin"] == pytest.approx(0.5) and flip["tie_db"] == 30.0
    step1 = (base[0, 1] + 3.0 * nn.functional.one_hot(torch.tensor(0), VOCAB)).numpy()  # after code 0
    assert flip["tie_margin"] == pytest.approx(tie_margin(30.0, step1)) and tie_margin(5.0, step1) > 0.5
    assert report.verdict == "fail" and not flip["tie"]
    # a stricter gate is not loosened: at fp32's 60 dB a 0.05 margin (a tie at 30 dB) fails
    strict = measure(_toy_component(*_bases(step1_gap=0.05)), _Run(_picks_runner_up), "toy", "float32", 60.0)
    assert strict.divergences[0]["tie_db"] == 60.0 and tie_margin(30.0, step1) > 0.05 and strict.verdict == "fail"
