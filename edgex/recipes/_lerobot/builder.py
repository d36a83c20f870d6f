"""What the flow VLAs' (SmolVLA, pi0) sample builders share: seeded observations drawn once, a
component whose specs come from its first sample and its reference's outputs, LeRobot's Euler
trajectory and the per-camera vision encoder component."""

from __future__ import annotations

import torch
from torch import nn

from ...component import DEFAULT_CALIBRATION_SIZE, Component
from ..base import RecipeFacts, build_component
from .policy import Policy

SEEDS = {"obs_a": 1, "obs_b": 2}  # sample seed offsets; calibration uses 100 +
ACTIONS = "actions"  # the output of a graph that returns unnormalized actions


def build_policy_component(facts: RecipeFacts, policy: Policy, name: str, module: nn.Module, input_names, samples: dict,
                           reference, output_names, description: str, calibration, metadata: dict, **fields) -> Component:
    """A LeRobot policy's graph (`build_component`): its `actions` output (unnormalized) is scored
    by its action error too, against the spread of each action dimension in the policy's data."""
    return build_component(facts, name, module, input_names, output_names, reference, samples, calibration,
                           keep_reference_outputs=False, description=description, metadata=metadata,
                           actions={n: policy.action_spread for n in output_names if n == ACTIONS}, **fields)


class FlowBuilder:
    """Subclasses set `facts` (their recipe's `RecipeFacts`), `vision_graph` (the vision encoder's graph class,
    built from the policy, its statistics and the cameras) with `vision_description`, and write
    `observation(seed)`, `image_tokens(image, camera)`, `prefix_outputs(obs)` and `velocity(x, t,
    *velocity_inputs(obs), keys, values, valid)` from their policy."""

    facts: RecipeFacts
    vision_graph: type[nn.Module]
    vision_description: str

    def __init__(self, policy: Policy, seed: int, steps: int):
        self.p, self.seed, self.steps = policy, seed, steps
        self.config = policy.config
        self.model = policy.policy.model
        self._cache: dict = {}

    def _component(self, name, *args, **fields) -> Component:
        return build_policy_component(self.facts, self.p, name, *args, **fields)

    def _obs(self, offset: int) -> dict:
        key = ("obs", offset)
        if key not in self._cache:
            self._cache[key] = self.observation(1000 * self.seed + offset)
        return self._cache[key]

    def velocity_inputs(self, obs: dict) -> tuple:
        """What `velocity` takes between t and the prefix K/V besides x_t (pi0: the robot state)."""
        return ()

    def trajectory(self, obs: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(x_t, t) at every Euler step of LeRobot's own schedule (its sample_actions loop). A step
        graph calibrates on one set per Euler step, each from another observation (`step_calibration`)."""
        keys, values, valid = self.prefix_outputs(obs)
        dt = -1.0 / self.steps
        x, out = obs["noise"], []
        for step in range(self.steps):
            t = torch.full((1,), 1.0 + step * dt, dtype=torch.float32)  # LeRobot expands a 0-d tensor; a 0 stride breaks ExecuTorch
            out.append((x, t))
            x = x + dt * self.velocity(x, t, *self.velocity_inputs(obs), keys, values, valid)
        return out

    def vision_encoder(self) -> Component:
        """Every camera at its own shape through one graph: `image_<camera>` -> `image_tokens_<camera>`
        (the prefix's input names); the reference runs LeRobot's own path camera by camera."""
        cameras, short = self.p.cameras, self.p.camera_names

        def reference(*images):
            return tuple(self.image_tokens(image, cam) for image, cam in zip(images, cameras))

        def sample(offset):
            return tuple(self._obs(offset)["images"])

        shapes = {n: list(self.p.camera_shape(c)) for n, c in zip(short, cameras)}
        return self._component(
            "vision_encoder", self.vision_graph(self.p.policy, self.p.stats, cameras), [f"image_{n}" for n in short],
            {n: sample(o) for n, o in SEEDS.items()}, reference, [f"image_tokens_{n}" for n in short],
            self.vision_description, lambda n: [sample(100 + i) for i in range(n)],
            {"cameras": cameras, "camera_shapes": shapes})

    @property
    def step_calibration_size(self) -> int:
        """Sets a step graph calibrates on by default: every Euler step at least once, and no fewer
        than the default (SmolVLA tiny's 4 steps alone: w8a16 scheme 14.8 dB; 8 sets: 27.2 dB)."""
        return max(self.steps, DEFAULT_CALIBRATION_SIZE)

    def step_calibration(self, sample):
        """A step graph's calibration: set i is observation 100 + i at Euler step i % steps
        (`step_calibration_size` sets by default), so the quantizer's ranges see every step's x_t
        and t and more than one state and language mask. Drawn from one observation's first 8 steps, pi0's tiny w8a16
        step clipped the held-out state, the last step's x_t and RoPE positions past the calibrated
        prefix length (scheme 5.4 dB)."""
        return lambda n: [sample(100 + i, i % self.steps) for i in range(n)]
