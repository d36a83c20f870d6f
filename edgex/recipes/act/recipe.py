"""Recipe `act`: LeRobot's ACT policy as one graph (see `facts.py`, `graphs.py`).

The reference is LeRobot's own inference path: its preprocessor (normalization), `ACTPolicy.
predict_action_chunk`, its postprocessor (unnormalization). Samples and calibration sets are seeded
observations: state drawn around the statistics' mean, images uniform in [0, 1].
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...component import Component
from ...errors import EdgexError
from .. import RECIPES
from .._lerobot.builder import build_policy_component
from .._lerobot.lerobot_import import lerobot_modules
from .._lerobot.policy import (Policy, check_stats, features, load_weights, needed_stats, parse_config, random_stats,
                               read_config, read_stats, seeded_weights)
from ..base import LoadedModel, Recipe
from .facts import FACTS, PRESETS, ROLES
from .graphs import ActPolicyGraph

_SAMPLES = {"obs_a": 1, "obs_b": 2}  # seed offsets; calibration uses 100 +


def _policy(config, stats, source) -> Policy:
    m = lerobot_modules()
    if config.feedforward_activation != "relu":
        raise EdgexError(f"ACT feedforward_activation {config.feedforward_activation!r}: edgex's graph supports relu")
    if config.env_state_feature is not None:
        raise EdgexError("ACT with observation.environment_state is not supported by edgex's graph (state + cameras only)")
    policy = m.act.ACTPolicy(config).eval()
    pre, post = m.act_processor.make_act_pre_post_processors(config, dataset_stats=stats)
    return Policy(policy, stats, pre, post, source, list(config.image_features))


@RECIPES.register(FACTS.name)
class ActRecipe(Recipe):
    facts = FACTS

    def load(self, preset: str | None, checkpoint: Path | None, seed: int, options: dict | None = None) -> LoadedModel:
        m = lerobot_modules()
        if checkpoint is not None:
            read_config(checkpoint, "act")
            config = parse_config(m.act_config.ACTConfig, checkpoint, {"pretrained_backbone_weights": None})
            stats = read_stats(checkpoint)
            check_stats(stats, config, needed_stats(config))
            loaded = _policy(config, stats, {"checkpoint": str(Path(checkpoint).resolve())})
            load_weights(loaded.policy, checkpoint)
        else:
            name = preset or self.default_preset
            p = PRESETS[name]
            inputs, outputs = features(p["state_dim"], p["action_dim"], p["cameras"])
            config = m.act_config.ACTConfig(input_features=inputs, output_features=outputs, device="cpu",
                                            pretrained_backbone_weights=None, **p["config"])
            loaded = _policy(config, random_stats(config, seed), {"preset": name, "seed": seed})
            seeded_weights(loaded.policy, seed)
        loaded.policy.eval()
        return LoadedModel(self.name, loaded, loaded.source, {"seed": seed})

    def components(self, loaded: LoadedModel, names: list[str] | None = None) -> list[Component]:
        for n in names or []:
            if n not in ROLES:
                raise EdgexError(f"no such component {n!r} in act (known: {', '.join(ROLES)})")
        return [policy_component(loaded.models, loaded.options["seed"])]


def observation(policy: Policy, seed: int) -> tuple[torch.Tensor, ...]:
    """(state [1, S], image per camera [1, 3, H, W]) for one seeded observation."""
    gen = torch.Generator().manual_seed(seed)
    config = policy.config
    state_stats = policy.stats.get("observation.state", {})
    dim = config.robot_state_feature.shape[0]
    mean, std = state_stats.get("mean", torch.zeros(dim)), state_stats.get("std", torch.ones(dim))
    state = (mean + std * torch.randn(dim, generator=gen))[None]
    images = [torch.rand((1, *config.image_features[c].shape), generator=gen) for c in policy.cameras]
    return (state, *images)


def policy_component(policy: Policy, seed: int) -> Component:
    cameras = policy.cameras

    def reference(state, *images):
        return (policy.chunk(policy.observation(state, list(images))),)

    samples = {name: observation(policy, 1000 * seed + off) for name, off in _SAMPLES.items()}
    return build_policy_component(
        FACTS, policy, "policy", ActPolicyGraph(policy.policy, policy.stats, cameras),
        ["state"] + [f"image_{n}" for n in policy.camera_names], samples, reference, ["actions"],
        "raw state + RGB [0,1] images -> unnormalized action chunk (normalization inside)",
        lambda n: [observation(policy, 1000 * seed + 100 + i) for i in range(n)],
        {"chunk": policy.config.chunk_size, "n_action_steps": policy.config.n_action_steps,
         "cameras": cameras, "camera_shapes": {n: list(policy.camera_shape(c)) for n, c in zip(policy.camera_names, cameras)},
         "normalization": "inside the graph (inputs raw, actions unnormalized)"})
