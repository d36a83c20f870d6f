"""Recipe `pi0`: pi0 as vision / prefix / action-step / action-loop graphs.

The eager model is LeRobot 0.4.4's pi0 code around edgex's `PaliGemmaWithExpert` (`model.py`: the
fork LeRobot needs cannot be installed). Presets build LeRobot's `PI0Config` with edgex's sizes,
seeded random weights and seeded statistics; `--checkpoint DIR` reads LeRobot's `save_pretrained`
layout: `config.json` (`type: pi0`; the sizes follow its `paligemma_variant` /
`action_expert_variant`), `model.safetensors` with LeRobot's names (checked against the config from
the file header before anything is allocated), and the normalization statistics of its processor
files. Normalization uses LeRobot's own Normalizer / Unnormalizer steps (its pi0 preprocessor also
tokenizes, which needs the hub tokenizer: the language tokens are a graph input instead).

References are LeRobot's code: its image preprocessing (`patches.lerobot.pi0_preprocess_images`) + the PaliGemma image embedding (vision),
`embed_prefix` + `make_att_2d_masks` + the prefix forward filling the K/V cache (prefix),
`denoise_step` (action step), and its Euler schedule over `denoise_step` + the postprocessor
(loop). The chained artifacts are compared with `predict_action_chunk` in the tests.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ...component import Component
from ...errors import EdgexError
from ...patches.lerobot import pi0_preprocess_images
from .. import RECIPES
from .._lerobot.lerobot_import import lerobot_module
from .._lerobot.policy import (Policy, check_stats, features, needed_stats, parse_config, processors, random_stats,
                               read_config, read_stats, seeded_weights)
from .._lerobot.builder import SEEDS, FlowBuilder
from ..base import LoadedModel, Recipe
from . import facts
from .graphs import PI0Loop, PI0Prefix, PI0Step, PI0Vision
from .model import build_policy, lerobot_pi0

# Not read by pi0 inference (the expert's output goes through action_out_proj): a checkpoint may lack it.
_UNUSED = ("model.paligemma_with_expert.gemma_expert.lm_head.weight",)


def pi0_config_class():
    return lerobot_module("lerobot.policies.pi0.configuration_pi0").PI0Config


def checkpoint_sizes(config) -> dict:
    """edgex's sizes for a LeRobot PI0Config: its Gemma variants, SigLIP So400m, PaliGemma's vocabulary."""
    for key in ("paligemma_variant", "action_expert_variant"):
        if getattr(config, key) not in facts.GEMMA_VARIANTS:
            raise EdgexError(f"pi0 {key} {getattr(config, key)!r} is unknown (known: {', '.join(facts.GEMMA_VARIANTS)})")
    return {"siglip": facts.SIGLIP_SO400M, "vlm": facts.GEMMA_VARIANTS[config.paligemma_variant],
            "expert": facts.GEMMA_VARIANTS[config.action_expert_variant], "vocab_size": facts.PALIGEMMA_VOCAB}


def _build(config, sizes: dict, device: str | None = None):
    if config.empty_cameras:
        raise EdgexError("pi0 with empty_cameras is not supported by edgex's graphs (every camera is an input)")
    if config.rtc_config is not None and config.rtc_config.enabled:
        raise EdgexError("pi0 with real-time chunking (rtc_config) is not supported by edgex's graphs")
    config.dtype = "float32"
    try:
        if device is None:
            return build_policy(config, sizes)
        with torch.device(device):
            return build_policy(config, sizes)
    except ValueError as exc:
        raise EdgexError(f"pi0 config: {exc}") from None


def _tied(policy) -> dict[str, list[str]]:
    """Parameter name -> every name sharing it (PaliGemma ties lm_head to embed_tokens)."""
    groups: dict[int, list[str]] = {}
    for name, p in policy.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return {name: names for names in groups.values() for name in names}


def check_checkpoint_tensors(policy, path: Path) -> None:
    """Names and shapes of `model.safetensors` (header only) against the policy the config builds."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        raise EdgexError(f"checkpoint {path.parent} has no model.safetensors")
    try:
        with safe_open(str(path), "pt") as f:
            found = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise EdgexError(f"corrupt safetensors file {path}: {exc}") from None
    own = {k: tuple(v.shape) for k, v in policy.state_dict().items()}
    tied = _tied(policy)
    missing = sorted(k for k in own if k not in _UNUSED and not any(t in found for t in tied.get(k, [k])))
    unexpected = sorted(set(found) - set(own))
    bad = [k for k in own if k in found and found[k] != own[k]]
    if missing or unexpected or bad:
        what = (f"missing {missing[0]}" if missing else f"unexpected {unexpected[0]}" if unexpected
                else f"{bad[0]} has shape {found[bad[0]]}, config says {own[bad[0]]}")
        raise EdgexError(f"checkpoint {path} does not match its config.json: {what} "
                         f"({len(missing) + len(unexpected) + len(bad)} tensors differ)")


def load_checkpoint_weights(policy, path: Path) -> None:
    from safetensors.torch import load_file

    state = load_file(str(path))
    for name, names in _tied(policy).items():
        if name not in state:
            state.update({name: state[t] for t in names if t in state})
    own = policy.state_dict()
    policy.load_state_dict({k: v.to(own[k].dtype) for k, v in state.items()}, strict=False)


@RECIPES.register(facts.FACTS.name)
class PI0Recipe(Recipe):
    facts = facts.FACTS

    def load(self, preset: str | None, checkpoint: Path | None, seed: int, options: dict | None = None) -> LoadedModel:
        if checkpoint is not None:
            folder = Path(checkpoint)
            read_config(folder, "pi0")
            config = parse_config(pi0_config_class(), folder, {})
            stats = read_stats(folder)
            check_stats(stats, config, needed_stats(config))
            sizes = checkpoint_sizes(config)
            check_checkpoint_tensors(_build(config, sizes, "meta"), folder / "model.safetensors")
            policy = _build(config, sizes)
            load_checkpoint_weights(policy, folder / "model.safetensors")
            source = {"checkpoint": str(folder.resolve())}
        else:
            name = preset or self.default_preset
            p = facts.PRESETS[name]
            inputs, outputs = features(p["state_dim"], p["action_dim"], p["cameras"])
            config = pi0_config_class()(input_features=inputs, output_features=outputs, device="cpu", **p["config"])
            stats = random_stats(config, seed)
            policy = _build(config, p)
            seeded_weights(policy, seed)
            source = {"preset": name, "seed": seed}
        pre, post = processors(config, stats)
        loaded = Policy(policy, stats, pre, post, source, list(config.image_features))
        steps = (options or {}).get("steps", config.num_inference_steps)
        return LoadedModel(self.name, loaded, source, {"seed": seed, "steps": steps})

    def components(self, loaded: LoadedModel, names: list[str] | None = None) -> list[Component]:
        self.facts.check_components(names)
        builder = Builder(loaded.models, loaded.options["seed"], loaded.options["steps"])
        return [getattr(builder, n)() for n in names or facts.ROLES]


class Builder(FlowBuilder):
    """Samples from the eager pipeline: seeded observations -> image tokens and prefix K/V from
    LeRobot's code -> its own Euler trajectory."""

    facts = facts.FACTS
    vision_graph = PI0Vision
    vision_description = "every camera's RGB [0,1] image at its own shape -> its image tokens (per-camera normalization, LeRobot's resize-with-pad, [-1,1], SigLIP, projector inside)"

    def __init__(self, policy: Policy, seed: int, steps: int):
        super().__init__(policy, seed, steps)
        self.pwe = self.model.paligemma_with_expert

    # --- the eager pipeline -------------------------------------------------------------
    def observation(self, seed: int) -> dict:
        gen = torch.Generator().manual_seed(seed)
        c = self.config
        dim = c.robot_state_feature.shape[0]
        st = self.p.stats.get("observation.state", {})
        state = st.get("mean", torch.zeros(dim)) + st.get("std", torch.ones(dim)) * torch.randn((1, dim), generator=gen)
        images = [torch.rand((1, *c.image_features[cam].shape), generator=gen) for cam in self.p.cameras]
        length = c.tokenizer_max_length
        vocab = self.pwe.paligemma.config.text_config.vocab_size
        tokens = torch.randint(0, vocab, (1, length), generator=gen)
        valid = length - int(torch.randint(0, max(1, length // 2), (1,), generator=gen))  # right padding, as the tokenizer
        mask = (torch.arange(length) < valid)[None]
        noise = torch.randn((1, c.chunk_size, c.max_action_dim), generator=gen)
        return {"state": state, "images": images, "tokens": tokens, "mask": mask, "noise": noise}

    def batch(self, obs: dict) -> dict:
        """The observation as LeRobot's preprocessor hands it to the policy (normalized state)."""
        batch = self.p.preprocess({"observation.state": obs["state"], **dict(zip(self.p.cameras, obs["images"]))})
        batch["observation.language.tokens"], batch["observation.language.attention_mask"] = obs["tokens"], obs["mask"]
        return batch

    def image_tokens(self, image: torch.Tensor, camera: str) -> torch.Tensor:
        """LeRobot's path for one camera: its preprocessor (the camera's own statistics), then
        its image preprocessing and the PaliGemma image embedding."""
        imgs, _ = pi0_preprocess_images(self.p.policy, self.p.preprocess({camera: image}))
        with torch.no_grad():
            return self.pwe.embed_image(imgs[0])

    def _prefix(self, tokens_per_camera, lang_tokens, lang_mask):
        """LeRobot's embed_prefix (its embed_image answered by the given tokens) and the K/V fill."""
        pi0 = lerobot_pi0()
        given = iter(tokens_per_camera)
        masks = [torch.ones(1, dtype=torch.bool) for _ in tokens_per_camera]
        self.pwe.embed_image = lambda _img: next(given)
        try:
            with torch.no_grad():
                embs, pad, att = self.model.embed_prefix(list(tokens_per_camera), masks, lang_tokens, lang_mask.bool())
                att4d = self.model._prepare_attention_masks_4d(pi0.make_att_2d_masks(pad, att))
                _, cache = self.pwe.forward(attention_mask=att4d, position_ids=torch.cumsum(pad, dim=1) - 1,
                                            past_key_values=None, inputs_embeds=[embs, None], use_cache=True)
        finally:
            del self.pwe.embed_image
        keys = torch.stack([k.transpose(1, 2) for k, _ in cache])  # [L, 1, P, KV, D]
        values = torch.stack([v.transpose(1, 2) for _, v in cache])
        return keys, values, pad.float()

    def prefix_inputs(self, obs: dict) -> tuple:
        tokens = [self.image_tokens(img, cam) for img, cam in zip(obs["images"], self.p.cameras)]
        return (*tokens, obs["tokens"], obs["mask"].float())

    def prefix_outputs(self, obs: dict) -> tuple:
        key = id(obs)
        if key not in self._cache:
            self._cache[key] = self._prefix(*self._split(self.prefix_inputs(obs)))
        return self._cache[key]

    @staticmethod
    def _split(inputs):
        *tokens, lang, mask = inputs
        return tokens, lang, mask

    def velocity_inputs(self, obs: dict) -> tuple:
        return (obs["state"],)

    def velocity(self, x_t, t, state, keys, values, valid):
        from transformers.cache_utils import DynamicCache

        padded = lerobot_pi0().pad_vector(self.p.preprocess({"observation.state": state})["observation.state"],
                                          self.config.max_state_dim)
        cache = DynamicCache(ddp_cache_data=[(keys[i].transpose(1, 2), values[i].transpose(1, 2)) for i in range(keys.shape[0])])
        with torch.no_grad():
            return self.model.denoise_step(state=padded, prefix_pad_masks=valid > 0, past_key_values=cache, x_t=x_t, timestep=t)

    # --- components ---------------------------------------------------------------------
    def prefix(self) -> Component:
        names = [f"image_tokens_{n}" for n in self.p.camera_names] + ["lang_tokens", "lang_mask"]

        def reference(*inputs):
            return self._prefix(*self._split(inputs))

        samples = {n: self.prefix_inputs(self._obs(o)) for n, o in SEEDS.items()}
        return self._component(
            "prefix", PI0Prefix(self.p.policy), names, samples, reference, ["prefix_key", "prefix_value", "prefix_mask"],
            "image tokens + language tokens/mask -> per-layer K/V of the PaliGemma Gemma (after RoPE) and prefix mask",
            lambda n: [self.prefix_inputs(self._obs(100 + i)) for i in range(n)],
            {"layers": len(self.pwe.paligemma.model.language_model.layers), "rope_theta": 10000},
            tables={"embed_tokens": self.pwe.paligemma.model.language_model.embed_tokens.weight})

    def action_step(self) -> Component:
        def sample(offset, index):
            obs = self._obs(offset)
            x, t = self.trajectory(obs)[index % self.steps]
            return (x, t, obs["state"], *self.prefix_outputs(obs))

        return self._component(
            "action_step", PI0Step(self.p.policy, self.p.stats),
            ["x_t", "t", "state", "prefix_key", "prefix_value", "prefix_mask"],
            {"obs_a_t1": sample(1, 0), "obs_b_last": sample(2, -1), f"obs_c_step{self.steps // 2}": sample(3, self.steps // 2)}, lambda *a: (self.velocity(*a),), ["velocity"],
            "(x_t, t, raw state, prefix K/V, mask) -> velocity (normalized action space; state normalization inside)",
            self.step_calibration(sample), {"chunk": self.config.chunk_size}, calibration_size=self.step_calibration_size)

    def action_loop(self) -> Component:
        def sample(offset):
            obs = self._obs(offset)
            return (obs["noise"], obs["state"], *self.prefix_outputs(obs))

        def reference(noise, state, keys, values, valid):
            dt = -1.0 / self.steps
            x = noise
            for step in range(self.steps):
                t = torch.full((1,), 1.0 + step * dt, dtype=torch.float32)
                x = x + dt * self.velocity(x, t, state, keys, values, valid)
            return (self.p.postprocess(x[:, :, : self.config.action_feature.shape[0]]),)

        return self._component(
            "action_loop", PI0Loop(self.p.policy, self.p.stats, self.steps),
            ["noise", "state", "prefix_key", "prefix_value", "prefix_mask"],
            {n: sample(o) for n, o in SEEDS.items()}, reference, ["actions"],
            f"noise + raw state + prefix K/V + mask -> unnormalized action chunk ({self.steps} Euler steps, "
            "state normalization and action unnormalization inside)",
            lambda n: [sample(100 + i) for i in range(n)], {"steps": self.steps, "dt": -1.0 / self.steps})


__all__ = ["PI0Recipe", "Builder"]
