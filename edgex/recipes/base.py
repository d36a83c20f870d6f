"""Recipe: one model family. Loads the eager model and splits it into components.

Light on import (no torch): `RecipeFacts` is what name checks, `edgex list` and `--dry-run` read.
"""

from __future__ import annotations

import json
import re

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, TYPE_CHECKING, Callable

from ..errors import EdgexError

if TYPE_CHECKING:
    from torch import nn

    from ..component import Component


def stage_options(stage) -> list[tuple[str, ...]]:
    """A pipeline stage of `Recipe.in_situ_components` as its alternatives, each a tuple of the
    components that serve the stage together (one name: one component)."""
    return [(o,) if isinstance(o, str) else tuple(o) for o in ((stage,) if isinstance(stage, str) else stage)]


_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*([mb])\b", re.IGNORECASE)


def stated_parameters(preset: str, description: str) -> float | None:
    """The parameter count a preset's name or its description states (`0.6b`, `450m`, `... 52M`);
    None where neither states one. A recipe states its published presets' sizes there, in the
    model's own words: the family's nominal size, which may fall short of the parameters its eager
    model holds (a published name counts the language model, not the decoder beside it)."""
    for text in (preset, description):
        found = _SIZE.findall(text)
        if found:
            number, unit = found[-1]
            return float(number) * (1e9 if unit.lower() == "b" else 1e6)
    return None


@dataclass
class LoadedModel:
    """An eager model plus where its weights came from (recorded in the manifest)."""

    recipe: str
    models: object
    source: dict
    options: dict = field(default_factory=dict)


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("expected a positive integer")
    return value


@dataclass(frozen=True)
class RecipeOption:
    """A build option of a recipe (`edgex export MODEL --set KEY=VALUE`): graph sizes and the like
    that are not part of the model's weights, so every recipe declares its own without a CLI flag."""

    description: str
    parse: Callable[[str], object] = positive_int  # raises ValueError on bad text


def parse_settings(values: list[str] | None) -> dict[str, str]:
    """`--set max_context=1024 --set prefill=64` -> {"max_context": "1024", "prefill": "64"}."""
    settings: dict[str, str] = {}
    for value in values or []:
        key, sep, text = value.partition("=")
        if not sep or not key.strip():
            raise EdgexError(f"bad --set {value!r}: expected KEY=VALUE")
        settings[key.strip()] = text.strip()
    return settings


@dataclass(frozen=True)
class ComponentPrecisions:
    """The precisions a component is placed at by default where its own arithmetic needs other ones
    than its role's placement on a target gives (a time embedding fp16 cannot resolve, a head that
    keeps a calibrated scheme beside fp16), and why, with the measured figures. Targets place roles
    only; this is how a recipe narrows or widens that for one of its components without naming
    itself in a target. `by_exporter`: exporter name, or "*" for any exporter, -> precisions."""

    by_exporter: dict[str, tuple[str, ...]]
    reason: str

    def on(self, exporter: str) -> tuple[str, ...] | None:
        return self.by_exporter.get(exporter, self.by_exporter.get("*"))


@dataclass(frozen=True)
class RecipeFacts:
    """What a recipe declares in its light `facts` module: everything needed to check a command
    line and print `edgex list` without building (or importing) the model."""

    name: str
    description: str
    presets: dict[str, str]  # preset name -> one-line description
    components: dict[str, str]  # component name -> role
    options: dict[str, RecipeOption] = field(default_factory=dict)  # `--set KEY=VALUE` build options
    default_preset: str = "tiny"
    # component -> why its arithmetic must stay fp32: a target whose placement for it builds no fp32
    # places it on its "fp32" placement instead (`Target.placements_for`)
    fp32_components: dict[str, str] = field(default_factory=dict)
    # component -> precision -> the measured figure showing that precision's own error on that
    # component lies in the band where broken graphs score (its scheme reference alone: top-1 tokens
    # flipped beyond the tie margin, or an SNR a broken graph reaches). No target places it there by
    # default; asked for by name (-p, --placement) it is built, with a one-line warning, and
    # recorded in its manifest entry (`coarse_scheme`).
    coarse: dict[str, dict[str, str]] = field(default_factory=dict)

    # component -> its waveform outputs whose phase the model leaves free (a vocoder's sine source
    # integrates F0 over thousands of radians: float rounding or any phase offset moves every later
    # sample while the sound stays the same). Their phase-insensitive spectral figure
    # (`metrics.spectral_db`) is gated in place of their waveform SNR, which is recorded beside it.
    spectral_outputs: dict[str, tuple[str, ...]] = field(default_factory=dict)

    # component -> how many passes of its network one call of its graph unrolls, where more than one
    # (Qwen3-TTS's predictor frame: its 15 residual codebooks in one graph). The scheduler's estimate of
    # a job's cost, where none is recorded, scales with it (`edgex.scheduler`).
    unrolled_steps: dict[str, int] = field(default_factory=dict)

    # component -> why it is built only when named (`--component`): a graph only some checkpoints
    # of the family hold, or one that only some apps need (Qwen3-TTS's voice-prompt encoders).
    on_request: dict[str, str] = field(default_factory=dict)

    def default_components(self) -> list[str]:
        """The components an export builds when none is named: all but the `on_request` ones."""
        return [n for n in self.components if n not in self.on_request]

    # Distributions (pip names) whose code or data the eager model and its reference run, beyond
    # torch and numpy (`edgex.artifacts.keys.BASE_PACKAGES`): their versions are in the key of this
    # recipe's artifacts only, so upgrading one re-exports this recipe's artifacts and no other's.
    reference_packages: tuple[str, ...] = ()
    # Files outside the checkpoint folder that the model is built from (SmolVLA's VLM config, found
    # by a name in the checkpoint's config): checkpoint folder -> {what: sha256, or None when absent}.
    # In the key beside the checkpoint's own hash; light (no torch), and it never raises.
    external_inputs: Callable[[Path], dict[str, str | None]] | None = None
    # component -> its own default precisions per exporter, where they differ from its role's
    # placement (`ComponentPrecisions`); applied on every target, never where the user placed it.
    placed_precisions: dict[str, ComponentPrecisions] = field(default_factory=dict)
    # A role this recipe introduces -> the known role whose placement it takes on every target
    # (`edgex.targets.ROLES`). Without it, planning a component of an unknown role is an error.
    placed_like: dict[str, str] = field(default_factory=dict)

    # Files whose contents a runtime fixes per model (`Placement.declared_only`: libmtmd's speech
    # generation graphs): (exporter, preset, checkpoint folder) -> component -> None where this
    # recipe writes that component's file for the exporter from these weights, else the one-line
    # reason it cannot; a component absent is not declared. Light: configs only, no model built.
    declared_files: Callable[[str, "str | None", "Path | None"], dict[str, "str | None"]] | None = None

    def declared_reason(self, target, exporter: str, component: str, preset: str | None, checkpoint) -> str | None:
        """Why a `declared_only` placement does not build `component` from these weights, or None."""
        declared = self.declared_files(exporter, preset, checkpoint) if self.declared_files else {}
        if component in declared:
            return declared[component]
        role = self.placement_role(component)
        return target.facts.get("declared_only", {}).get(role) or f"{self.name} declares no {exporter} file for {component}"

    def coarse_reason(self, component: str, precision: str) -> str | None:
        """Why `precision` is too coarse for `component` (see `coarse`), or None."""
        return self.coarse.get(component, {}).get(precision)

    def placement_role(self, component: str) -> str:
        """The role a target places `component` by: its own, or the known role that one is placed like."""
        role = self.components[component]
        return self.placed_like.get(role, role)

    @property
    def placement_roles(self) -> dict[str, str]:
        """Component name -> the role targets place it by."""
        return {name: self.placement_role(name) for name in self.components}

    def placements_on(self, target, component: str) -> tuple:
        """Where `target` places `component` by default (`Target.placements_for`), with what this
        recipe declares for it: its role, fp32-only arithmetic and its own precisions."""
        own = self.components[component]  # placed by the user under the recipe's own role name, else like a known one
        role = own if own in target.placements else self.placement_role(component)
        return target.placements_for(role, component, component in self.fp32_components, self.placed_precisions.get(component))

    def check_preset(self, preset: str | None) -> None:
        if preset is not None and preset not in self.presets:
            raise EdgexError(f"no such preset {preset!r} for {self.name} (known: {', '.join(self.presets)})")

    def check_components(self, names: list[str] | None) -> None:
        for n in names or []:
            if n not in self.components:
                raise EdgexError(f"no such component {n!r} in {self.name} (known: {', '.join(self.components)})")

    def parse_options(self, settings: dict[str, str] | None) -> dict:
        """Typed options from `--set` text; an unknown key or a bad value is a one-line error."""
        known = self.options
        parsed = {}
        for key, text in (settings or {}).items():
            if key not in known:
                raise EdgexError(f"unknown option {key!r} for {self.name} (known: {', '.join(known) or 'none'})")
            try:
                parsed[key] = known[key].parse(str(text))
            except ValueError as exc:
                raise EdgexError(f"bad value {text!r} for option {key} of {self.name}: {exc}") from None
        return parsed


class Recipe(ABC):
    """The heavy half of a recipe package (`recipe.py`); its declarations come from `facts`."""

    facts: RecipeFacts

    @property
    def name(self) -> str:
        return self.facts.name

    @property
    def description(self) -> str:
        return self.facts.description

    @property
    def default_preset(self) -> str:
        return self.facts.default_preset

    def options(self) -> dict[str, RecipeOption]:
        return dict(self.facts.options)

    def parse_options(self, settings: dict[str, str] | None) -> dict:
        return self.facts.parse_options(settings)

    def presets(self) -> dict[str, str]:
        return dict(self.facts.presets)

    def component_names(self) -> dict[str, str]:
        """Component name -> role, without building anything."""
        return dict(self.facts.components)

    @abstractmethod
    def load(self, preset: str | None, checkpoint: Path | None, seed: int, options: dict | None = None) -> LoadedModel:
        """Build from a preset (seeded random weights) or load a local checkpoint; `options` are
        the parsed build options (see `options`)."""

    @abstractmethod
    def components(self, loaded: LoadedModel, names: list[str] | None = None) -> list[Component]:
        """The deployable graphs (all, or those named), each with samples from the eager pipeline."""

    def iter_components(self, loaded: LoadedModel, names: list[str] | None = None) -> Iterator[Component]:
        """`components`, in the same order, each built when asked for: an export starts the first
        component's jobs while the next are built. A recipe whose components share costly samples
        overrides it to build them on demand; by default all are built at the first."""
        yield from self.components(loaded, names)

    # The components the model's own pipeline composes (`edgex pipeline`), one per stage; a tuple of
    # names is one stage with alternative components (the first placed one serves); empty: none yet.
    in_situ_components: tuple[str | tuple[str, ...], ...] = ()
    # Components the pipeline composes where the folders hold them (an app's optional graphs, e.g. a
    # voice-prompt encoder): one held is chosen like a stage above (a failed one is refused), one
    # absent is left out and the recipe's `in_situ` sees no stage of that name.
    in_situ_optional: tuple[str, ...] = ()

    def in_situ(self, loaded: LoadedModel, stages: dict, settings: dict, progress) -> dict:
        """Run `stages` (artifacts as float32 numpy callables, `edgex.in_situ.Stage`) composed as the
        model's pipeline beside the eager pipeline, same seed and noise; return the figures and
        `failures` (one line each; none means the pipeline passes). `settings`: `frames` (frames or
        decode steps), `stream_frames` (frames of the streaming-schedule comparison), each None for
        the recipe's default."""
        raise EdgexError(f"{self.name} has no in-situ pipeline yet")


def build_component(facts: RecipeFacts, name: str, module: nn.Module, input_names, outputs, reference: Callable,
                    samples: dict, calibration: Callable | None = None, *, keep_reference_outputs: bool,
                    metadata: dict | None = None, **fields) -> Component:
    """Component `name` of `facts`' recipe, the one way every recipe builds one: its role and spectral
    outputs from `facts`, its input specs from its first sample and its output specs from the
    reference's outputs on that sample (shapes and dtypes written nowhere else), every sample
    checked against the specs.

    `outputs`: per output, its name or `(name, kind[, sampled_from])` (`TensorSpec`).
    `keep_reference_outputs`: keep the reference's outputs on the first sample for parity
    (`Component.keep_reference_outputs`) instead of parity running the reference on it again.
    `fields`: the other `Component` fields as the recipe declares them (`written`, `layouts`,
    `tables`, `forced_reference`, `calibration_size`, `description`, `actions`, `float_only`)."""
    import torch

    from ..component import Component, TensorSpec

    def spec(declared, tensor) -> TensorSpec:
        name, *kind = (declared,) if isinstance(declared, str) else declared
        return TensorSpec(name, tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."), *kind)

    first_name, first = next(iter(samples.items()))
    with torch.no_grad():
        computed = tuple(reference(*first))
    component = Component(name, facts.components[name], module.eval(), [spec(n, t) for n, t in zip(input_names, first)],
                          [spec(d, t) for d, t in zip(outputs, computed)], reference, samples, metadata=dict(metadata or {}),
                          calibration=calibration, spectral=facts.spectral_outputs.get(name, ()), **fields)
    for sample in samples.values():
        component.check_inputs(sample)
    if keep_reference_outputs:
        component.keep_reference_outputs(first_name, computed)
    return component


def spread_calibration(make: Callable[[str, int], tuple], per_utterance: int, *, ends: bool) -> Callable[[int], list]:
    """A component's `calibration(n)`: `n` input sets `make("cal<u>", k)`, k < `per_utterance`
    (the positions one calibration utterance u = 0, 1, ... offers), spread evenly over the positions
    of as many utterances as `n` needs. With `ends`, the very first and last position are always
    among them (a quantizer calibrated on early positions only clips the ranges of later ones)."""

    def draw(n: int) -> list:
        slots = -(-n // per_utterance) * per_utterance
        if ends:
            picked = [round(i * (slots - 1) / (n - 1)) for i in range(n)] if n > 1 else [0]
        else:
            picked = [i * slots // n for i in range(n)]
        return [make(f"cal{s // per_utterance}", s % per_utterance) for s in picked]

    return draw


def read_config_json(path: Path) -> dict:
    """A checkpoint's JSON config; missing or malformed -> one-line error."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise EdgexError(f"checkpoint is missing {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EdgexError(f"checkpoint config {path} is not valid JSON: {exc}") from None


def read_safetensors(folder: Path) -> dict:
    """Every tensor of the *.safetensors files in `folder`; none or a corrupt one -> one-line error."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise EdgexError(f"checkpoint folder {folder} has no .safetensors file")
    state: dict = {}
    for file in files:
        try:
            state.update(load_file(str(file)))
        except (SafetensorError, OSError, ValueError) as exc:
            raise EdgexError(f"corrupt safetensors file {file}: {exc}") from None
    return state
