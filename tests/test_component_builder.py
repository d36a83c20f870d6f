"""The one component builder every recipe uses (`edgex.recipes.base.build_component`) and its
calibration spreader: what each explicit option does."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgex.component import LOGITS, SIGNAL
from edgex.recipes.base import RecipeFacts, build_component, spread_calibration

FACTS = RecipeFacts("toy", "a toy recipe", {"tiny": "toy"}, {"step": "talker", "wave": "decoder"},
                    spectral_outputs={"wave": ("wav",)})


class _Scale(nn.Module):
    def forward(self, x):
        return x * 2, (x * 3).sum(-1)


def _reference(x):
    return x * 2, (x * 3).sum(-1)


def test_specs_role_spectral_and_kept_reference_come_from_one_place():
    samples = {"a": (torch.ones(1, 4),), "b": (torch.zeros(1, 4),)}
    kept = build_component(FACTS, "wave", _Scale(), ["x"], [("wav", SIGNAL), ("logits", LOGITS)], _reference, samples,
                           keep_reference_outputs=True, metadata={"frames": 4})
    assert kept.role == "decoder" and kept.spectral == ("wav",) and kept.metadata == {"frames": 4}
    assert [(s.name, s.shape, s.dtype, s.kind) for s in kept.inputs] == [("x", (1, 4), "float32", SIGNAL)]
    assert [(s.name, s.shape, s.kind) for s in kept.outputs] == [("wav", (1, 4), SIGNAL), ("logits", (1,), LOGITS)]
    assert list(kept.computed()["_reference_outputs"]) == ["a"] and not kept.module.training
    plain = build_component(FACTS, "step", _Scale(), ["x"], ["y", "total"], _reference, samples, keep_reference_outputs=False)
    assert plain.role == "talker" and plain.spectral == () and not plain.computed()["_reference_outputs"]
    with pytest.raises(ValueError, match="spec"):  # a sample off the first one's shape
        build_component(FACTS, "step", _Scale(), ["x"], ["y", "total"], _reference,
                        {"a": (torch.ones(1, 4),), "b": (torch.ones(1, 5),)}, keep_reference_outputs=False)


def test_calibration_spreads_over_utterances_with_or_without_the_ends():
    def make(utterance, k):
        return int(utterance.removeprefix("cal")), k

    assert spread_calibration(make, 4, ends=True)(3) == [(0, 0), (0, 2), (0, 3)]
    assert spread_calibration(make, 4, ends=False)(3) == [(0, 0), (0, 1), (0, 2)]
    assert spread_calibration(make, 4, ends=True)(6) == [(0, 0), (0, 1), (0, 3), (1, 0), (1, 2), (1, 3)]  # the last position too
    assert spread_calibration(make, 4, ends=False)(8) == [(u, k) for u in range(2) for k in range(4)]
    assert spread_calibration(make, 1, ends=True)(1) == [(0, 0)]


def test_references_computed_with_their_reads_equal_the_separate_passes():
    class _TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            return (self.used(x),)

    torch.manual_seed(0)
    module = _TwoHeads()
    samples = {"a": (torch.randn(1, 4),), "b": (torch.randn(1, 4),)}

    def make():
        return build_component(FACTS, "step", module, ["x"], [("y", SIGNAL)], lambda x: (module.used(x) + 1,), samples,
                               keep_reference_outputs=False)

    together, apart = make(), make()
    together.compute_references(reads=True)
    assert together.reference_reads() == apart.reference_reads() == {id(module.used.weight), id(module.used.bias)}
    assert together.module_reads() == apart.module_reads()
    for name in samples:
        assert torch.equal(together.reference_outputs(name)[0], apart.reference_outputs(name)[0])
        assert torch.equal(together.reference_outputs(name)[0], module.used(samples[name][0]) + 1)
