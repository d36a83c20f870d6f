"""Qualcomm AI Hub adapter: run an exported artifact on a real phone and score it there.

After local parity, `--hub` uploads each artifact that did not fail it, compiles it for the device
when its files need it, runs a profile job (on-device latency) and an inference job on the
component's own samples, downloads the outputs and scores them against the eager reference exactly like local parity
(method `device`). `qai_hub` is imported only inside the functions that talk to AI Hub, so the CLI
stays instant without it.
"""

from __future__ import annotations

from .client import DEFAULT_TIMEOUT_S, HubConnection, HubSettings, connect
from .run import HUB_DIR, device_parity

__all__ = ["DEFAULT_TIMEOUT_S", "HUB_DIR", "HubConnection", "HubSettings", "connect", "device_parity"]
