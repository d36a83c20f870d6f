"""Recipe `smolvla`: LeRobot's SmolVLA as vision / prefix / action-step / action-loop graphs.

Building never touches the hub: LeRobot's SmolVLMWithExpertModel asks `AutoConfig` and
`AutoProcessor` for `vlm_model_name` even with `load_vlm_weights=False`; edgex hands it a SmolVLM
config built locally (a preset's, or the checkpoint's `vlm_model_name` read from a local folder or
the local Hugging Face cache, offline) and no processor (the language tokens are a graph input;
special image tokens are refused). Normalization uses LeRobot's own Normalizer / Unnormalizer
steps (its SmolVLA preprocessor also tokenizes, which needs the hub tokenizer).

References are LeRobot's code: `prepare_images` + `embed_image` (vision), `embed_prefix` +
`make_att_2d_masks` + the VLM-with-expert forward filling the KV cache (prefix), `denoise_step`
(action step), and Euler over `denoise_step` + the postprocessor (loop). The chained artifacts are
compared with `select_action` in the tests.
"""

from __future__ import annotations

import copy
import types
from contextlib import contextmanager
from pathlib import Path

import torch

from ...checkpoints import resolve_checkpoint
from ...component import Component
from ...errors import EdgexError
from .. import RECIPES
from .._lerobot.lerobot_import import lerobot_modules
from .._lerobot.policy import (Policy, check_stats, features, load_weights, needed_stats, parse_config, processors,
                               random_stats, read_config, read_stats, seeded_weights)
from .._lerobot.builder import SEEDS, FlowBuilder
from ..base import LoadedModel, Recipe
from .facts import FACTS, PRESETS, ROLES
from .graphs import SmolVLALoop, SmolVLAPrefix, SmolVLAStep, SmolVLAVision



def vlm_config(spec: dict):
    """A SmolVLM config from edgex's dict of text / vision sizes."""
    from transformers import SmolVLMConfig

    return SmolVLMConfig(text_config={"model_type": "llama", **spec["text"]}, vision_config=dict(spec["vision"]),
                         scale_factor=spec["scale_factor"])


def vlm_config_from(name: str):
    """`vlm_model_name` (a folder or a hub id) -> its config, from disk only."""
    from transformers import AutoConfig

    folder = resolve_checkpoint(name)
    try:
        return AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise EdgexError(f"vlm_model_name {name}: no usable config.json in {folder} ({str(exc).splitlines()[0]})") from None


@contextmanager
def _local_vlm(config):
    """LeRobot's SmolVLM-with-expert constructor with its hub lookups answered locally."""
    module = lerobot_modules().smolvla_vlm
    saved = module.AutoConfig, module.AutoProcessor
    # ids read at construction and used only with add_image_special_tokens, which edgex refuses
    no_tokenizer = types.SimpleNamespace(fake_image_token_id=-1, global_image_token_id=-1)
    module.AutoConfig = types.SimpleNamespace(from_pretrained=lambda *_a, **_k: copy.deepcopy(config))
    module.AutoProcessor = types.SimpleNamespace(from_pretrained=lambda *_a, **_k: types.SimpleNamespace(tokenizer=no_tokenizer))
    try:
        yield
    finally:
        module.AutoConfig, module.AutoProcessor = saved


def _policy(config, vlm, stats, source) -> Policy:
    m = lerobot_modules()
    if config.add_image_special_tokens:
        raise EdgexError("smolvla with add_image_special_tokens is not supported by edgex (its graphs take no special tokens)")
    if config.adapt_to_pi_aloha or config.empty_cameras:
        raise EdgexError("smolvla with adapt_to_pi_aloha or empty_cameras is not supported by edgex's graphs")
    config.load_vlm_weights = False
    with _local_vlm(vlm):
        policy = m.smolvla.SmolVLAPolicy(config).eval()
    pre, post = processors(config, stats)
    return Policy(policy, stats, pre, post, source, list(config.image_features))


@RECIPES.register(FACTS.name)
class SmolVLARecipe(Recipe):
    facts = FACTS

    def load(self, preset: str | None, checkpoint: Path | None, seed: int, options: dict | None = None) -> LoadedModel:
        m = lerobot_modules()
        if checkpoint is not None:
            read_config(checkpoint, "smolvla")
            config = parse_config(m.smolvla_config.SmolVLAConfig, checkpoint, {"load_vlm_weights": False})
            stats = read_stats(checkpoint)
            check_stats(stats, config, needed_stats(config))
            loaded = _policy(config, vlm_config_from(config.vlm_model_name), stats, {"checkpoint": str(Path(checkpoint).resolve())})
            load_weights(loaded.policy, checkpoint)
        else:
            name = preset or self.default_preset
            p = PRESETS[name]
            inputs, outputs = features(p["state_dim"], p["action_dim"], p["cameras"])
            config = m.smolvla_config.SmolVLAConfig(input_features=inputs, output_features=outputs, device="cpu", **p["config"])
            loaded = _policy(config, vlm_config(p["vlm"]), random_stats(config, seed), {"preset": name, "seed": seed})
            seeded_weights(loaded.policy, seed)
        steps = (options or {}).get("steps", loaded.config.num_steps)
        return LoadedModel(self.name, loaded, loaded.source, {"seed": seed, "steps": steps})

    def components(self, loaded: LoadedModel, names: list[str] | None = None) -> list[Component]:
        for n in names or []:
            if n not in ROLES:
                raise EdgexError(f"no such component {n!r} in smolvla (known: {', '.join(ROLES)})")
        builder = Builder(loaded.models, loaded.options["seed"], loaded.options["steps"])
        return [getattr(builder, n)() for n in names or ROLES]


class Builder(FlowBuilder):
    """Samples from the eager pipeline: seeded observations -> LeRobot's image tokens and prefix
    K/V -> LeRobot's own Euler trajectory."""

    facts = FACTS
    vision_graph = SmolVLAVision
    vision_description = "every camera's RGB [0,1] image at its own shape -> its image tokens (per-camera normalization, resize-with-pad, SigLIP, connector, sqrt(d) scale inside)"

    def __init__(self, policy: Policy, seed: int, steps: int):
        super().__init__(policy, seed, steps)
        self.vwe = self.model.vlm_with_expert

    # --- the eager pipeline -------------------------------------------------------------
    def observation(self, seed: int) -> dict:
        gen = torch.Generator().manual_seed(seed)
        c = self.config
        dim = c.robot_state_feature.shape[0]
        st = self.p.stats.get("observation.state", {})
        state = st.get("mean", torch.zeros(dim)) + st.get("std", torch.ones(dim)) * torch.randn((1, dim), generator=gen)
        images = [torch.rand((1, *c.image_features[cam].shape), generator=gen) for cam in self.p.cameras]
        length = c.tokenizer_max_length
        vocab = self.vwe.config.text_config.vocab_size
        tokens = torch.randint(0, vocab, (1, length), generator=gen)
        valid = length - int(torch.randint(0, max(1, length // 2), (1,), generator=gen))  # right padding, as LeRobot's tokenizer
        mask = (torch.arange(length) < valid)[None]
        noise = torch.randn((1, c.chunk_size, c.max_action_dim), generator=gen)
        return {"state": state, "images": images, "tokens": tokens, "mask": mask, "noise": noise}

    def image_tokens(self, image: torch.Tensor, camera: str) -> torch.Tensor:
        """LeRobot's path for one camera: its preprocessor (the camera's own statistics), then
        `prepare_images` and `embed_image`, scaled as `embed_prefix` scales it."""
        imgs, _ = self.p.policy.prepare_images(self.p.preprocess({camera: image}))
        with torch.no_grad():
            emb = self.vwe.embed_image(imgs[0])
        return emb * torch.tensor(emb.shape[-1] ** 0.5, dtype=emb.dtype)

    def _prefix(self, tokens_per_camera, lang_tokens, lang_mask, state):
        """LeRobot's embed_prefix (its embed_image answered by the given tokens) and KV fill."""
        smolvla = lerobot_modules().smolvla
        scale = torch.tensor(tokens_per_camera[0].shape[-1] ** 0.5, dtype=tokens_per_camera[0].dtype)
        given = iter(tokens_per_camera)
        batch = self.p.preprocess({"observation.state": state})
        padded = smolvla.pad_vector(batch["observation.state"], self.config.max_state_dim)
        images = [t for t in tokens_per_camera]
        masks = [torch.ones(1, dtype=torch.bool) for _ in images]
        saved = self.vwe.embed_image
        self.vwe.embed_image = lambda _img: next(given) / scale
        try:
            with torch.no_grad():
                embs, pad, att = self.model.embed_prefix(images, masks, lang_tokens, lang_mask.bool(), state=padded)
                att2d = smolvla.make_att_2d_masks(pad, att)
                positions = torch.cumsum(pad, dim=1) - 1
                _, cache = self.vwe.forward(attention_mask=att2d, position_ids=positions, past_key_values=None,
                                            inputs_embeds=[embs, None], use_cache=True, fill_kv_cache=True)
        finally:
            self.vwe.embed_image = saved
        keys = torch.stack([cache[i]["key_states"] for i in range(len(cache))])
        values = torch.stack([cache[i]["value_states"] for i in range(len(cache))])
        return keys, values, pad.float()

    def prefix_inputs(self, obs: dict) -> tuple:
        tokens = [self.image_tokens(img, cam) for img, cam in zip(obs["images"], self.p.cameras)]
        return (*tokens, obs["tokens"], obs["mask"].float(), obs["state"])

    def prefix_outputs(self, obs: dict) -> tuple:
        key = id(obs)
        if key not in self._cache:
            *tokens, lang, mask, state = self.prefix_inputs(obs)
            self._cache[key] = self._prefix(tokens, lang, mask, state)
        return self._cache[key]

    def velocity(self, x_t, t, keys, values, valid):
        cache = {i: {"key_states": keys[i], "value_states": values[i]} for i in range(keys.shape[0])}
        with torch.no_grad():
            return self.model.denoise_step(prefix_pad_masks=valid > 0, past_key_values=cache, x_t=x_t, timestep=t)

    # --- components ---------------------------------------------------------------------
    def prefix(self) -> Component:
        names = [f"image_tokens_{n}" for n in self.p.camera_names] + ["lang_tokens", "lang_mask", "state"]

        def reference(*inputs):
            *tokens, lang, mask, state = inputs
            return self._prefix(tokens, lang, mask, state)

        samples = {n: self.prefix_inputs(self._obs(o)) for n, o in SEEDS.items()}
        return self._component(
            "prefix", SmolVLAPrefix(self.p.policy, self.p.stats), names, samples, reference,
            ["prefix_key", "prefix_value", "prefix_mask"],
            "image tokens + language tokens/mask + raw state -> per-layer K/V (after RoPE) and prefix mask (state normalization inside)",
            lambda n: [self.prefix_inputs(self._obs(100 + i)) for i in range(n)],
            {"layers": self.vwe.num_vlm_layers, "rope_wavelength": 10000, "normalization": "state normalization inside"},
            tables={"embed_tokens": self.vwe.get_vlm_model().text_model.embed_tokens.weight})

    def action_step(self) -> Component:
        def sample(offset, index):
            obs = self._obs(offset)
            x, t = self.trajectory(obs)[index % self.steps]
            return (x, t, *self.prefix_outputs(obs))

        def reference(x, t, keys, values, valid):
            return (self.velocity(x, t, keys, values, valid),)

        # the first, a middle and the last Euler step of the host loop
        samples = {"obs_a_t1": sample(1, 0), "obs_b_last": sample(2, -1), f"obs_c_step{self.steps // 2}": sample(3, self.steps // 2)}
        return self._component(
            "action_step", SmolVLAStep(self.p.policy), ["x_t", "t", "prefix_key", "prefix_value", "prefix_mask"],
            samples, reference, ["velocity"], "(x_t, t, prefix K/V, mask) -> velocity (normalized action space)",
            self.step_calibration(sample), {"chunk": self.config.chunk_size}, calibration_size=self.step_calibration_size)

    def action_loop(self) -> Component:
        def sample(offset):
            obs = self._obs(offset)
            return (obs["noise"], *self.prefix_outputs(obs))

        def reference(noise, keys, values, valid):
            dt = -1.0 / self.steps
            x = noise
            for step in range(self.steps):
                x = x + dt * self.velocity(x, torch.full((1,), 1.0 + step * dt, dtype=torch.float32), keys, values, valid)
            return (self.p.postprocess(x[:, :, : self.config.action_feature.shape[0]]),)

        return self._component(
            "action_loop", SmolVLALoop(self.p.policy, self.p.stats, self.steps), ["noise", "prefix_key", "prefix_value", "prefix_mask"],
            {n: sample(o) for n, o in SEEDS.items()}, reference, ["actions"],
            f"noise + prefix K/V + mask -> unnormalized action chunk ({self.steps} Euler steps inside, action unnormalization inside)",
            lambda n: [sample(100 + i) for i in range(n)], {"steps": self.steps, "dt": -1.0 / self.steps})


__all__ = ["SmolVLARecipe", "Builder"]
