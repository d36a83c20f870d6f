"""Runtime adapters (one per format), registered by name."""

from ...registry import Registry

RUNTIMES: Registry = Registry("runtime", __name__)
