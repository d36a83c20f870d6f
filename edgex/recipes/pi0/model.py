"""pi0 as LeRobot 0.4.4 runs it, on the transformers release edgex installs.

LeRobot's `PI0Pytorch` builds a `PaliGemmaWithExpertModel` on a transformers fork (openpi's
`transformers_replace`, pinned to 4.53.2) and refuses to build without it. The fork changes three
things pi0 inference depends on, measured by diffing it against transformers 4.57 (docs/models.md):

- `PaliGemmaModel.get_image_features` does not divide the projected image tokens by sqrt(width);
- `GemmaModel.forward` does not multiply `inputs_embeds` by sqrt(width) (LeRobot scales the language
  embeddings itself; image tokens and the expert's suffix enter unscaled);
- an attention layer given past K/V with `use_cache=False` attends over past + new K/V without
  appending to the cache (every Euler step sees only the prefix and its own suffix).

(The rest of the fork is adaRMS for pi0.5 and bfloat16 casts, unused by pi0 in float32.)
`PaliGemmaWithExpert` below is edgex's replacement for that one class: transformers' stock
`PaliGemmaForConditionalGeneration` and `GemmaForCausalLM` modules, LeRobot's parameter names, and
a forward that runs their decoder layers with the fork's semantics. Everything else is LeRobot's
own pi0 code (`PI0Pytorch.embed_prefix / embed_suffix / denoise_step / sample_actions`,
`PI0Policy`'s image preprocessing and `predict_action_chunk`), subclassed only to skip the fork check in
their constructors. The graphs (`graphs.py`) share none of this; a test compares both with an
independent reading of LeRobot's / openpi's code (`tests/test_pi0.py`).
"""

from __future__ import annotations

from functools import cache

import torch
from torch import nn

from .._lerobot.lerobot_import import lerobot_module
from ...patches.transformers import eager_attention


def paligemma_config(siglip: dict, vlm: dict, vocab: int, image_size: int):
    """The PaliGemma config LeRobot builds (`PaliGemmaWithExpertModel.__init__`), from edgex's sizes."""
    from transformers import PaliGemmaConfig

    text = {"model_type": "gemma", "hidden_size": vlm["width"], "intermediate_size": vlm["mlp_dim"],
            "num_attention_heads": vlm["num_heads"], "num_key_value_heads": vlm["num_kv_heads"], "head_dim": vlm["head_dim"],
            "num_hidden_layers": vlm["depth"], "vocab_size": vocab, "hidden_activation": "gelu_pytorch_tanh"}
    vision = {"model_type": "siglip_vision_model", **siglip, "image_size": image_size, "vision_use_head": False}
    config = PaliGemmaConfig(vision_config=vision, text_config=text, image_token_index=vocab,
                             projection_dim=vlm["width"], hidden_size=vlm["width"])
    eager_attention(config, config.text_config, config.vision_config)
    return config


def expert_config(expert: dict, vocab: int):
    """The action expert's Gemma config (`action_expert_config_hf` in LeRobot)."""
    from transformers import GemmaConfig

    config = GemmaConfig(head_dim=expert["head_dim"], hidden_size=expert["width"], intermediate_size=expert["mlp_dim"],
                         num_attention_heads=expert["num_heads"], num_hidden_layers=expert["depth"],
                         num_key_value_heads=expert["num_kv_heads"], vocab_size=vocab, hidden_activation="gelu_pytorch_tanh")
    eager_attention(config)
    return config


def _decoder(model, hidden, mask, positions, cache_):
    """A Gemma model's decoder layers and final norm, without its sqrt(width) input scaling (the fork)."""
    position_embeddings = model.rotary_emb(hidden, positions)
    for layer in model.layers:
        hidden = layer(hidden, attention_mask=mask, position_ids=positions, past_key_values=cache_,
                       use_cache=cache_ is not None, position_embeddings=position_embeddings)
    return model.norm(hidden)


class PaliGemmaWithExpert(nn.Module):
    """PaliGemma (SigLIP + Gemma) and the Gemma action expert under LeRobot's names, with the
    forward LeRobot's pi0 calls: the prefix fills a K/V cache, the suffix attends over it."""

    def __init__(self, vlm_config, action_config):
        super().__init__()
        from transformers import GemmaForCausalLM, PaliGemmaForConditionalGeneration

        self.paligemma = PaliGemmaForConditionalGeneration(config=vlm_config)
        self.gemma_expert = GemmaForCausalLM(config=action_config)
        self.gemma_expert.model.embed_tokens = None  # as LeRobot: the expert reads embeddings only

    def embed_image(self, image: torch.Tensor) -> torch.Tensor:
        tower = self.paligemma.model.vision_tower
        return self.paligemma.model.multi_modal_projector(tower(image).last_hidden_state)

    def embed_language_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.paligemma.model.language_model.embed_tokens(tokens)

    def forward(self, attention_mask=None, position_ids=None, past_key_values=None, inputs_embeds=None,
                use_cache=None, adarms_cond=None):
        from transformers.cache_utils import DynamicCache

        if adarms_cond is not None and any(c is not None for c in adarms_cond):
            raise ValueError("adaRMS conditioning is pi0.5's; edgex's pi0 has none")
        prefix, suffix = inputs_embeds
        if suffix is None:  # the prefix: fill a fresh cache
            filled = DynamicCache() if use_cache else None
            out = _decoder(self.paligemma.model.language_model, prefix, attention_mask, position_ids, filled)
            return [out, None], filled
        if prefix is not None:
            raise ValueError("the joint prefix + suffix forward is LeRobot's training path; edgex runs inference only")
        out = _decoder(self.gemma_expert.model, suffix, attention_mask, position_ids, suffix_cache(past_key_values))
        return [None, out], None


def suffix_cache(past_key_values):
    """What the suffix attends over: a copy of the prefix cache (the fork concatenates without
    appending), so the cache the caller holds stays the prefix's for the next Euler step."""
    from transformers.cache_utils import DynamicCache

    return None if past_key_values is None else DynamicCache(ddp_cache_data=[(k, v) for k, v in past_key_values])


@cache
def _classes():
    """LeRobot's PI0Pytorch / PI0Policy with constructors that build edgex's PaliGemmaWithExpert
    instead of checking for the transformers fork; every other method is LeRobot's."""
    pi0 = lerobot_module("lerobot.policies.pi0.modeling_pi0")
    pretrained = lerobot_module("lerobot.policies.pretrained")

    class PI0Model(pi0.PI0Pytorch):
        def __init__(self, config, sizes: dict):
            nn.Module.__init__(self)
            self.config = config
            self.rtc_processor = None
            image = config.image_resolution[0]
            self.paligemma_with_expert = PaliGemmaWithExpert(
                paligemma_config(sizes["siglip"], sizes["vlm"], sizes["vocab_size"], image),
                expert_config(sizes["expert"], sizes["vocab_size"]))
            width = sizes["expert"]["width"]
            self.action_in_proj = nn.Linear(config.max_action_dim, width)
            self.action_out_proj = nn.Linear(width, config.max_action_dim)
            self.state_proj = nn.Linear(config.max_state_dim, width)
            self.action_time_mlp_in = nn.Linear(2 * width, width)
            self.action_time_mlp_out = nn.Linear(width, width)
            self.gradient_checkpointing_enabled = False

    class PI0Policy(pi0.PI0Policy):
        def __init__(self, config, sizes: dict):
            pretrained.PreTrainedPolicy.__init__(self, config)
            config.validate_features()
            self.config = config
            self.init_rtc_processor()
            self.model = PI0Model(config, sizes)
            self.reset()

    return PI0Model, PI0Policy, pi0


def build_policy(config, sizes: dict):
    """LeRobot's PI0Policy (edgex's PaliGemmaWithExpert inside) for a PI0Config and edgex's sizes."""
    if config.image_resolution[0] != config.image_resolution[1]:
        raise ValueError(f"PaliGemma expects a square image resolution, not {config.image_resolution}")
    return _classes()[1](config, sizes).eval()


def lerobot_pi0():
    """LeRobot's modeling_pi0 module (its masks, padding and time embedding functions)."""
    return _classes()[2]
