"""Task figures where dB misleads: a policy's actions scored per dimension against each dimension's
spread (`metrics.action_error`, gated at `gates.ACTION_ERROR`), on small synthetic components (no
export)."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from edgex.component import Component, TensorSpec
from edgex.parity import metrics
from edgex.parity.check import measure
from edgex.parity.gates import ACTION_ERROR
from edgex.parity.runtimes.base import Session

CHUNK = 8
SPREAD = (50.0, 0.05)  # a joint in degrees beside a gripper in metres: magnitudes three decades apart


def _policy(obs):
    """A chunk of actions [1, CHUNK, 2]: dimension 0 around 100 units, dimension 1 around 0.1."""
    steps = torch.arange(CHUNK, dtype=torch.float32)[None, :, None]
    return (torch.cat([100.0 + 30.0 * torch.sin(steps + obs[..., :1]), 0.1 + 0.03 * torch.cos(steps + obs[..., 1:])], -1),)


def _component(actions: bool = True) -> Component:
    samples = {f"obs_{i}": (torch.full((1, 1, 2), float(i)),) for i in range(2)}
    return Component("toy_policy", "action", nn.Identity(), [TensorSpec("obs", (1, 1, 2), "float32")],
                     [TensorSpec("actions", (1, CHUNK, 2), "float32")], _policy, samples,
                     actions={"actions": SPREAD} if actions else {})


class _Run(Session):
    def __init__(self, error):
        self.error = error

    def run(self, inputs):
        (actions,) = _policy(torch.from_numpy(inputs[0]))
        return [actions.numpy() + np.asarray(self.error, np.float32)]


def test_action_error_is_per_dimension_rms_over_the_chunk_in_units_of_its_spread():
    ref = np.zeros((1, 4, 2))
    out = ref + np.array([[[1.0, 0.0], [-1.0, 0.0], [1.0, 0.2], [-1.0, 0.0]]])
    assert metrics.action_error(ref, out, (2.0, 0.1)) == pytest.approx([0.5, 1.0])
    assert np.all(np.isinf(metrics.action_error(ref, out * np.nan, (2.0, 0.1))))
    with pytest.raises(ValueError, match="3 dimension"):
        metrics.action_error(ref, out, (1.0, 1.0, 1.0))


def test_a_wrong_small_dimension_passes_the_snr_gate_and_fails_the_action_gate():
    """The gripper off by half its spread: over 70 dB SNR over the chunk, which passes every precision's
    gate, and a gripper that does not close."""
    wrong = (0.0, 0.5 * SPREAD[1])
    report = measure(_component(), _Run(wrong), "toy", "float32", 30.0)
    assert report.min_snr_db > 45.0
    assert report.max_action_error == pytest.approx(0.5, rel=1e-3)
    assert report.verdict == "fail"
    assert report.failures == [f"action error 0.5 of a dimension's spread above the {ACTION_ERROR:g} gate"]
    assert report.samples["obs_0"]["actions"]["action_error_dims"] == pytest.approx([0.0, 0.5], abs=1e-3)
    # without the declaration the same artifact passes: the SNR alone cannot see it
    assert measure(_component(actions=False), _Run(wrong), "toy", "float32", 30.0).verdict == "pass"


def test_a_faithful_policy_within_the_action_gate_passes():
    close = (0.02 * SPREAD[0], 0.02 * SPREAD[1])
    report = measure(_component(), _Run(close), "toy", "float32", 30.0)
    assert report.verdict == "pass", report.failures
    assert report.max_action_error == pytest.approx(0.02, rel=1e-3) and report.max_action_error <= ACTION_ERROR


def test_non_finite_actions_fail_the_action_gate():
    report = measure(_component(), _Run((math.nan, 0.0)), "toy", "float32", 30.0)
    assert report.verdict == "fail" and report.max_action_error == math.inf
