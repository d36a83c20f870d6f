"""Qualcomm AI Hub adapter: run an exported artifact on a real phone and score it there.

After local parity, `--hub` uploads each artifact, compiles it for the device when the format needs
it, runs a profile job (on-device latency) and an inference job on the component's own samples,
downloads the outputs and scores them against the eager reference exactly like local parity
(method `device`). `qai_hub` is imported only inside the functions that talk to AI Hub, so the CLI
stays instant without it.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class HubSettings:
    """What the user asked for on the command line."""

    device: str | None = None  # None: the target's facts["hub_device"]
    timeout_s: float = DEFAULT_TIMEOUT_S  # per job, wall clock


from .client import HubConnection, connect  # noqa: E402
from .run import device_parity  # noqa: E402

__all__ = ["DEFAULT_TIMEOUT_S", "HubConnection", "HubSettings", "connect", "device_parity"]
