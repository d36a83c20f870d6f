"""edgex: speech, language and robot-policy models to verified on-device artifacts."""

__version__ = "0.1.0"
