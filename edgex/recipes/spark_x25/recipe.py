"""Recipe `spark-x2.5`: Spark-X2.5, a hybrid sliding/full-attention LLM, as prefill + decode graphs.

Components (role `llm`; both run the same layers, a target places them alike):
  prefill   a fixed chunk of tokens against the cache state -> logits, updated ring, new full K/V
  decode    one token against the cache state -> logits, updated ring, new full K/V

The sliding layers' window lives in a ring buffer the graphs maintain; the full layers' cache has
`max_context` slots (`--set max_context=N`, and `--set prefill=N` for the chunk). See `graphs.py` for the
state contract and `runner.py` for a runner. Samples and calibration data are real eager
activations: cache states from running the reference model over seeded prompts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ...component import LOGITS, SIGNAL, Component
from ...errors import EdgexError
from .. import RECIPES
from ..base import LoadedModel, Recipe, build_component
from .checkpoint import load_checkpoint
from .config import CHECKPOINT_CONTEXT, CHECKPOINT_PREFILL, get_preset
from .facts import FACTS, FLOAT_ONLY, ROLES
from . import in_situ as situ
from .gguf import spark_layout
from .graphs import SparkDecode, SparkPrefill
from .model import SparkCache, build
from .reference import state_from_cache, step_reference

INPUTS = ["tokens", "position", "ring_key", "ring_value", "past_key", "past_value"]
OUTPUTS = [("logits", LOGITS), ("next_ring_key", SIGNAL), ("next_ring_value", SIGNAL), ("key", SIGNAL), ("value", SIGNAL)]


def _ring_slots_written(inputs) -> tuple:
    """next_ring_key/value [Ls, 1, KV, W, D]: a call writes positions position .. position + P - 1
    at slots p % W; the other slots are copies of ring_key/value (W - 1 of 16 for a decode step)."""
    tokens, position, ring_key = inputs[0], int(inputs[1].reshape(-1)[0]), inputs[2]
    slots = np.unique((position + np.arange(tokens.shape[1])) % ring_key.shape[3])
    return (slice(None),) * 3 + (slots,)


WRITTEN = {"next_ring_key": _ring_slots_written, "next_ring_value": _ring_slots_written}
_SAMPLE_SEEDS = {"a": 1, "b": 2}  # offsets from the user's seed; calibration prompts use 100 +
_CALIBRATION_SEED = 100
_CALIBRATION_PER_PROMPT = 4


@RECIPES.register(FACTS.name)
class SparkRecipe(Recipe):
    facts = FACTS
    in_situ_components = situ.COMPONENTS

    def in_situ(self, loaded, stages, settings, progress) -> dict:
        return situ.in_situ(loaded, stages, settings, progress)

    def load(self, preset: str | None, checkpoint: Path | None, seed: int, options: dict | None = None) -> LoadedModel:
        if checkpoint is not None:
            model = load_checkpoint(checkpoint)
            source, sizes = {"checkpoint": str(Path(checkpoint).resolve())}, (CHECKPOINT_PREFILL, CHECKPOINT_CONTEXT)
        else:
            p = get_preset(preset or self.default_preset)
            model = build(p.config, seed)
            source, sizes = {"preset": p.name, "seed": seed}, (p.prefill, p.context)
        options = options or {}
        prefill, context = options.get("prefill", sizes[0]), options.get("max_context", sizes[1])
        if prefill > context:
            raise EdgexError(f"prefill chunk {prefill} is larger than max_context {context}")
        sizes = {"prefill": prefill, "max_context": context, "window": model.config.sliding_window, "seed": seed}
        return LoadedModel(self.name, model, source, sizes)

    def components(self, loaded: LoadedModel, names: list[str] | None = None) -> list[Component]:
        for n in names or []:
            if n not in ROLES:
                raise EdgexError(f"no such component {n!r} in spark-x2.5 (known: {', '.join(ROLES)})")
        builder = _ComponentBuilder(loaded)
        return [getattr(builder, n)() for n in names or ROLES]


class _ComponentBuilder:
    """Inputs from the eager model run over seeded prompts: a and b for parity samples, further
    prompts (never a or b) for calibration."""

    def __init__(self, loaded: LoadedModel):
        self.model = loaded.models
        self.config = self.model.config
        self.chunk, self.context = loaded.options["prefill"], loaded.options["max_context"]
        self.seed = loaded.options["seed"]
        self.checkpoint = loaded.source.get("checkpoint")  # its tokenizer goes into the GGUF
        self._runs: dict[int, tuple[torch.Tensor, SparkCache]] = {}

    def _run(self, prompt_seed: int) -> tuple[torch.Tensor, SparkCache]:
        """A seeded prompt of `context` tokens and the eager cache over all of it, computed in one
        forward: a cache grown in whatever chunks earlier requests asked for would differ in the last
        bits with the set of components derived together, and so would every sample drawn from it
        (`edgex verify` and the build cache derive one component at a time)."""
        if prompt_seed not in self._runs:
            gen = torch.Generator().manual_seed(1000 * self.seed + prompt_seed)
            tokens = torch.randint(0, self.config.vocab_size, (1, self.context), generator=gen)
            cache = SparkCache.empty(self.config)
            self.model(tokens, cache)
            self._runs[prompt_seed] = (tokens, cache)
        return self._runs[prompt_seed]

    def _inputs(self, prompt_seed: int, position: int, count: int, stale_from: int | None = None) -> tuple[torch.Tensor, ...]:
        """The call at `position`: the state zero-padded as a runner starts it, or with the full
        layers' slots the call ignores (position onwards) holding another prompt's entries, as a
        runner that does not clear its cache between prompts leaves them."""
        tokens, cache = self._run(prompt_seed)
        ring_key, ring_value, past_key, past_value = state_from_cache(self.config, cache, position, self.context)
        if stale_from is not None:
            _, _, stale_key, stale_value = state_from_cache(self.config, self._run(stale_from)[1], self.context, self.context)
            past_key[..., position:, :], past_value[..., position:, :] = stale_key[..., position:, :], stale_value[..., position:, :]
        return (tokens[:, position : position + count], torch.tensor([position]), ring_key, ring_value, past_key, past_value)

    def _component(self, name, module, count: int, samples: dict, starts: list[int]) -> Component:
        """A graph of `count` tokens per call; calibration: prompts 100, 101, ... at the `starts`."""

        def calibration(n: int) -> list[tuple[torch.Tensor, ...]]:
            return [self._inputs(_CALIBRATION_SEED + i // _CALIBRATION_PER_PROMPT, starts[i % len(starts)], count) for i in range(n)]

        cfg = self.config
        return build_component(
            FACTS, name, module, INPUTS, OUTPUTS, lambda *x: step_reference(self.model, *x), samples, calibration,
            keep_reference_outputs=True,
            metadata={"tokens_per_call": count, "window": cfg.sliding_window, "max_context": self.context,
                      "sliding_layers": cfg.sliding_layers, "full_layers": cfg.full_layers},
            float_only=FLOAT_ONLY, layouts={"gguf": spark_layout(self.model, self.context, self.checkpoint)},
            written=WRITTEN, tables={"embedding": self.model.model.embedding.weight},
        )

    def prefill(self) -> Component:
        p, window = self.chunk, self.config.sliding_window
        late = (min(self.context - p, 2 * window + p) // p) * p  # ring wrapped at least twice
        samples = {"prompt_a_start0": self._inputs(_SAMPLE_SEEDS["a"], 0, p),
                   f"prompt_b_start{late}": self._inputs(_SAMPLE_SEEDS["b"], late, p)}
        starts = sorted({(j * (self.context - p) // (_CALIBRATION_PER_PROMPT - 1)) // p * p for j in range(_CALIBRATION_PER_PROMPT)})
        return self._component("prefill", SparkPrefill(self.model, self.context), p, samples, starts)

    def decode(self) -> Component:
        """The last slot (the example: the most RoPE rotation, the longest attention), the ring half
        full, and the default in-situ run's last decode call with stale entries in the slots it ignores."""
        window = self.config.sliding_window
        late, early = self.context - 1, min(window // 2, self.context) - 1
        in_situ_last = situ.last_decode_position(self.chunk, self.context)
        samples = {f"prompt_a_pos{late}_last_slot": self._inputs(_SAMPLE_SEEDS["a"], late, 1),
                   f"prompt_b_pos{early}": self._inputs(_SAMPLE_SEEDS["b"], early, 1)}
        if in_situ_last is not None:
            samples[f"prompt_a_pos{in_situ_last}_stale_slots"] = self._inputs(_SAMPLE_SEEDS["a"], in_situ_last, 1,
                                                                                stale_from=_SAMPLE_SEEDS["b"])
        starts = [j * (self.context - 1) // (_CALIBRATION_PER_PROMPT - 1) for j in range(_CALIBRATION_PER_PROMPT)]
        return self._component("decode", SparkDecode(self.model, self.context), 1, samples, starts)


__all__ = ["SparkRecipe", "ROLES", "FLOAT_ONLY"]
