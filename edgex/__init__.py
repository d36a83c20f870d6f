"""edgex: speech, language and robot-policy models to verified on-device artifacts."""

from . import torchvision_ops

__version__ = "0.1.0"

torchvision_ops.install()
