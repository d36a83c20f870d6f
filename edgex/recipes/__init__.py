"""Model-family recipes, registered by name."""

from ..registry import Registry

RECIPES: Registry = Registry("model", __name__)
