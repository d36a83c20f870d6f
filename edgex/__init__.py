"""edgex: speech, language and robot-policy models to verified on-device artifacts."""

from .patches.imports import torchvision_without_ops

__version__ = "0.1.0"

torchvision_without_ops()
