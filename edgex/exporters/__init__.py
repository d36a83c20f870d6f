"""Format exporters, registered by name."""

from ..registry import Registry

EXPORTERS: Registry = Registry("format", __name__)
