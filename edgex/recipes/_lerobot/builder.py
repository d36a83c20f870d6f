"""What the flow VLAs' (SmolVLA, pi0) sample builders share: seeded observations drawn once, and
a component whose specs come from its first sample and its reference's outputs."""

from __future__ import annotations

from ...component import Component, TensorSpec
from .policy import Policy


class FlowBuilder:
    """Subclasses set `roles` (component -> role) and write `observation(seed)` from their policy."""

    roles: dict[str, str]

    def __init__(self, policy: Policy, seed: int, steps: int):
        self.p, self.seed, self.steps = policy, seed, steps
        self.config = policy.config
        self.model = policy.policy.model
        self._cache: dict = {}

    def _component(self, name, module, input_names, samples, reference, output_names, description, calibration, metadata,
                   tables=None):
        first = next(iter(samples.values()))
        outs = reference(*first)
        comp = Component(
            name, self.roles[name], module.eval(),
            [TensorSpec(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in zip(input_names, first)],
            [TensorSpec(n, tuple(t.shape), "float32") for n, t in zip(output_names, outs)],
            reference, samples, description=description, metadata=metadata, calibration=calibration, tables=tables or {})
        for sample in samples.values():
            comp.check_inputs(sample)
        return comp

    def _obs(self, offset: int) -> dict:
        key = ("obs", offset)
        if key not in self._cache:
            self._cache[key] = self.observation(1000 * self.seed + offset)
        return self._cache[key]
