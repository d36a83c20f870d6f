"""Recipe: one model family. Loads the eager model and splits it into components."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from ..component import Component


@dataclass
class LoadedModel:
    """An eager model plus where its weights came from (recorded in the manifest)."""

    recipe: str
    models: object
    source: dict
    options: dict = field(default_factory=dict)


class Recipe(ABC):
    name: str
    description: str
    default_preset: str = "tiny"

    @abstractmethod
    def presets(self) -> dict[str, str]:
        """Preset name -> one-line description."""

    @abstractmethod
    def component_names(self) -> dict[str, str]:
        """Component name -> role, without building anything (for `edgex list`)."""

    @abstractmethod
    def load(self, preset: str | None, checkpoint: Path | None, seed: int) -> LoadedModel:
        """Build from a preset (seeded random weights) or load a local checkpoint."""

    @abstractmethod
    def components(self, loaded: LoadedModel, names: list[str] | None = None) -> list[Component]:
        """The deployable graphs (all, or those named), each with samples from the eager pipeline."""
