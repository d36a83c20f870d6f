"""A LeRobot policy as edgex loads it: the eager policy, its normalization statistics, and the
eager pipeline LeRobot runs at inference (preprocessor -> policy -> postprocessor).

Presets build LeRobot's own config with seeded random weights and seeded random statistics (so
normalization is exercised); `--checkpoint DIR` reads LeRobot's `save_pretrained` layout:
`config.json` + `model.safetensors`, and the statistics where 0.4.4 keeps them, in the processor
files (`policy_preprocessor_step_*_normalizer_processor.safetensors`, keys `<feature>.<stat>`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ...errors import EdgexError
from ...isolation import private_tempdir
from .lerobot_import import lerobot_modules

NORMALIZER_FILES = ("policy_preprocessor_step_*_normalizer_processor.safetensors",
                    "policy_postprocessor_step_*_unnormalizer_processor.safetensors")


@dataclass
class Policy:
    """The eager LeRobot policy plus the statistics and processors of its pipeline."""

    policy: torch.nn.Module
    stats: dict[str, dict[str, torch.Tensor]]
    preprocess: Callable
    postprocess: Callable
    source: dict
    cameras: list[str] = field(default_factory=list)  # image feature keys, in the policy's order

    def __post_init__(self):
        camera_names(self.cameras)  # two cameras with one short name fail at load, before any build

    @property
    def config(self):
        return self.policy.config

    @property
    def camera_names(self) -> list[str]:
        """Each camera's short name (`observation.images.top` -> `top`), the suffix of its graph
        inputs and outputs (`image_top`, `image_tokens_top`)."""
        return camera_names(self.cameras)

    @property
    def action_spread(self) -> tuple[float, ...]:
        """Each action dimension's spread in the policy's data, in its own units: the dataset's
        standard deviation, else half its min-max range; what parity measures action errors
        against (`Component.actions`)."""
        stats = self.stats.get("action", {})
        if "std" in stats:
            spread = stats["std"]
        elif "min" in stats and "max" in stats:
            spread = (stats["max"] - stats["min"]) / 2
        else:
            raise EdgexError("the policy's statistics hold no action std or min / max: its action error has no scale")
        return tuple(float(v) for v in spread.reshape(-1))

    def camera_shape(self, camera: str) -> tuple[int, int, int]:
        return tuple(self.config.image_features[camera].shape)

    def observation(self, state: torch.Tensor, images: list[torch.Tensor], **extra) -> dict:
        return {"observation.state": state, **dict(zip(self.cameras, images)), **extra}

    @torch.no_grad()
    def chunk(self, observation: dict, **kwargs) -> torch.Tensor:
        """LeRobot's inference path: preprocessor, `predict_action_chunk` (with `noise` where the
        policy samples), postprocessor -> unnormalized actions [B, chunk, action_dim]."""
        batch = self.preprocess(dict(observation))
        return self.postprocess(self.policy.predict_action_chunk(batch, **kwargs))


def camera_names(cameras: list[str]) -> list[str]:
    """Short names of LeRobot camera keys; two cameras whose names end alike are a one-line error."""
    short = [c.rsplit(".", 1)[-1] for c in cameras]
    if len(set(short)) != len(short):
        raise EdgexError(f"cameras {cameras} share a short name: edgex names graph inputs by the last part of each key")
    return short


def features(state_dim: int, action_dim: int, cameras: dict[str, tuple[int, int, int]], extra: dict | None = None):
    """LeRobot input / output features for a preset."""
    t = lerobot_modules().types
    inputs = {"observation.state": t.PolicyFeature(t.FeatureType.STATE, (state_dim,)),
              **{k: t.PolicyFeature(t.FeatureType.VISUAL, shape) for k, shape in cameras.items()}, **(extra or {})}
    return inputs, {"action": t.PolicyFeature(t.FeatureType.ACTION, (action_dim,))}


def random_stats(config, seed: int) -> dict[str, dict[str, torch.Tensor]]:
    """Seeded statistics for every feature, in every form a normalization mode may read."""
    gen = torch.Generator().manual_seed(seed)
    stats = {}
    for key, feature in {**config.input_features, **config.output_features}.items():
        shape = (feature.shape[0], 1, 1) if len(feature.shape) == 3 else tuple(feature.shape)
        mean = torch.rand(shape, generator=gen) * 0.5 if len(feature.shape) == 3 else torch.randn(shape, generator=gen)
        std = torch.rand(shape, generator=gen) * 0.5 + 0.25
        stats[key] = {"mean": mean, "std": std, "min": mean - 2 * std, "max": mean + 2 * std}
    return stats


def seeded_weights(policy: torch.nn.Module, seed: int) -> None:
    """Replace LeRobot's initialization with seeded random weights of a trained-like scale:
    zero-initialized layers (norm biases, some heads) would leave parts of a graph untested."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if p.dim() == 1 and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                fan_in = p[0].numel() if p.dim() > 1 else p.numel()
                p.copy_(torch.randn(p.shape, generator=gen) / max(fan_in, 1) ** 0.5)
        for name, b in policy.named_buffers():
            if name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))
            elif name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen))


def read_config(folder: Path, policy_type: str) -> dict:
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise EdgexError(f"checkpoint {folder} has no config.json (LeRobot save_pretrained layout)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EdgexError(f"checkpoint config {path} is not valid JSON: {exc}") from None
    if not isinstance(config, dict) or config.get("type") != policy_type:
        found = config.get("type") if isinstance(config, dict) else None
        raise EdgexError(f"checkpoint {folder} holds a {found!r} policy, not {policy_type!r}")
    return config


def parse_config(config_class, folder: Path, overrides: dict):
    """LeRobot's config from `config.json` (draccus), with edgex's overrides (no downloads).
    `from_pretrained` writes the config less its `type` to a temporary `.json` it never removes:
    it runs with a private temporary folder, removed after it."""
    import draccus
    from lerobot.configs.policies import PreTrainedConfig

    try:  # the base class resolves `type` to the registered config class, as LeRobot loads it
        with private_tempdir():
            config = PreTrainedConfig.from_pretrained(str(folder))
    except (draccus.utils.ParsingError, ValueError, TypeError, KeyError, FileNotFoundError) as exc:
        raise EdgexError(f"checkpoint {folder}/config.json is not a valid LeRobot config: {str(exc).splitlines()[0]}") from None
    if not isinstance(config, config_class):
        raise EdgexError(f"checkpoint {folder}/config.json parsed as {type(config).__name__}, not {config_class.__name__}")
    for key, value in overrides.items():
        setattr(config, key, value)
    config.device = "cpu"
    return config


def load_weights(policy: torch.nn.Module, folder: Path) -> None:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(folder) / "model.safetensors"
    if not path.is_file():
        raise EdgexError(f"checkpoint {folder} has no model.safetensors")
    try:
        state = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise EdgexError(f"corrupt safetensors file {path}: {exc}") from None
    own = policy.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    bad = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or bad:
        what = (f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}" if unexpected
                else f"{bad[0]} has shape {tuple(state[bad[0]].shape)}, config says {tuple(own[bad[0]].shape)}")
        n = len(missing) + len(unexpected) + len(bad)
        raise EdgexError(f"checkpoint {path} does not match its config.json: {what} ({n} tensors differ)")
    policy.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()})


def read_stats(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Normalization statistics from the processor files (`<feature>.<stat>` keys)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = [f for pattern in NORMALIZER_FILES for f in sorted(Path(folder).glob(pattern))]
    if not files:
        raise EdgexError(f"checkpoint {folder} has no normalization statistics "
                         f"({NORMALIZER_FILES[0]}, written by LeRobot 0.4's processor save_pretrained)")
    stats: dict[str, dict[str, torch.Tensor]] = {}
    for file in files:
        try:
            flat = load_file(str(file))
        except (SafetensorError, OSError, ValueError) as exc:
            raise EdgexError(f"corrupt safetensors file {file}: {exc}") from None
        for key, value in flat.items():
            feature, _, stat = key.rpartition(".")
            stats.setdefault(feature, {})[stat] = value.float()
    return stats


def check_stats(stats: dict, config, needed: dict[str, tuple[str, ...]]) -> None:
    """Every feature a normalization mode reads must have its statistics."""
    for feature, keys in needed.items():
        for stat in keys:
            if stat not in stats.get(feature, {}):
                raise EdgexError(f"normalization statistics lack {feature}.{stat} (needed by {config.type}'s normalization mapping)")


def needed_stats(config) -> dict[str, tuple[str, ...]]:
    """Which statistics each feature's normalization mode reads."""
    modes = lerobot_modules().types.NormalizationMode
    per_mode = {modes.MEAN_STD: ("mean", "std"), modes.MIN_MAX: ("min", "max"), modes.IDENTITY: ()}
    out = {}
    for key, feature in {**config.input_features, **config.output_features}.items():
        mode = config.normalization_mapping.get(feature.type.value, modes.IDENTITY)
        out[key] = per_mode.get(mode, ())
    return out


def processors(config, stats):
    """LeRobot's own Normalizer (inputs) and Unnormalizer (actions) as pipelines."""
    from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action
    from lerobot.processor.pipeline import PolicyProcessorPipeline

    from lerobot.utils.constants import POLICY_POSTPROCESSOR_DEFAULT_NAME, POLICY_PREPROCESSOR_DEFAULT_NAME

    n = lerobot_modules().normalize
    # LeRobot's pipeline names: save_pretrained then writes the processor files `read_stats` reads
    pre = PolicyProcessorPipeline(steps=[n.NormalizerProcessorStep(
        features={**config.input_features, **config.output_features}, norm_map=config.normalization_mapping, stats=stats)],
        name=POLICY_PREPROCESSOR_DEFAULT_NAME)
    post = PolicyProcessorPipeline(
        steps=[n.UnnormalizerProcessorStep(features=config.output_features, norm_map=config.normalization_mapping, stats=stats)],
        name=POLICY_POSTPROCESSOR_DEFAULT_NAME, to_transition=policy_action_to_transition, to_output=transition_to_policy_action)
    return pre, post
