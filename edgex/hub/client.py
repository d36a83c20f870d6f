"""AI Hub client set-up, and qai-hub's failures mapped to one-line EdgexErrors.

The token and API URL come from qai-hub's own config file (`qai-hub configure --api_token TOKEN`
writes ~/.qai_hub/client.ini; QAIHUB_CLIENT_INI points at another one), so edgex never stores a
token, and a test points the real client at a local server through the file's `api_url`.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import EdgexError
from ..toolchain import require

DEFAULT_TIMEOUT_S = 3600.0
CONFIGURE = "run `qai-hub configure --api_token TOKEN` with the token from your AI Hub account page"


@dataclass(frozen=True)
class HubSettings:
    """What the user asked for on the command line."""

    device: str | None = None  # None: the target's facts["hub_device"]
    timeout_s: float = DEFAULT_TIMEOUT_S  # per job, wall clock


@dataclass(frozen=True)
class HubConnection:
    """A checked AI Hub set-up: plain data, so export worker processes can rebuild the client."""

    device: str
    config_path: str
    api_url: str
    timeout_s: float

    def client(self):
        hub = require("qai_hub", "--hub (Qualcomm AI Hub jobs)")
        return hub.Client(config=_load_config(self.config_path))

    def to_json(self) -> dict:
        return {"device": self.device, "api_url": self.api_url, "timeout_s": self.timeout_s}


def _one_line(exc: BaseException) -> str:
    """qai-hub draws boxes around its messages; keep the words on one line."""
    text = re.sub(r"[┌┐└┘─│|]", " ", str(exc))
    return " ".join(text.split()) or type(exc).__name__


@contextlib.contextmanager
def hub_errors(doing: str) -> Iterator[None]:
    """Turn whatever the qai-hub client raises while `doing` into one EdgexError line, and keep its
    unconditional prints ("Downloaded model to ...") off stdout, where `--json` writes the manifest."""
    hub = require("qai_hub", "--hub (Qualcomm AI Hub jobs)")
    from qai_hub.public_rest_api import APIException

    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    except hub.UserError as exc:
        message = _one_line(exc)
        if message.startswith("Failed to authenticate"):
            raise EdgexError(f"AI Hub rejected the API token (401) while {doing}: {CONFIGURE}") from None
        raise EdgexError(f"AI Hub refused {doing}: {message}") from None
    except (hub.Error, APIException, ValueError) as exc:
        raise EdgexError(f"AI Hub failed while {doing}: {_one_line(exc)}") from None


def _load_config(path: str):
    require("qai_hub", "--hub (Qualcomm AI Hub jobs)")
    from qai_hub.api_utils import load_api_config_from_file
    from qai_hub.public_rest_api import APIException

    if not os.path.exists(path):
        raise EdgexError(f"no AI Hub token: {path} does not exist; {CONFIGURE} (or point QAIHUB_CLIENT_INI at a config file)")
    try:
        config = load_api_config_from_file(path)
    except APIException:  # the file lacks api_url / web_url / api_token
        raise EdgexError(f"no AI Hub token in {path}: {CONFIGURE}") from None
    if not config.api_token.strip():
        raise EdgexError(f"no AI Hub token in {path}: {CONFIGURE}")
    config.verbose = False  # no progress bars or status lines from the client
    return config


def connect(settings, target) -> HubConnection:
    """Resolve the device, then check the token and the device name with AI Hub before any model is
    built, so a bad set-up fails in seconds rather than after the exports."""
    device = settings.device or target.facts.get("hub_device")
    if not device:
        raise EdgexError(f"target {target.name} names no AI Hub device: pass --hub-device NAME (e.g. 'Samsung Galaxy S25')")
    if settings.timeout_s <= 0:
        raise EdgexError(f"bad --hub-timeout {settings.timeout_s:g}: expected seconds > 0")
    hub = require("qai_hub", "--hub (Qualcomm AI Hub jobs)")
    from qai_hub.api_utils import get_config_path

    path = get_config_path()
    client = hub.Client(config=_load_config(path))
    with hub_errors(f"looking up device {device!r}"):
        found = client.get_devices(name=device)
    if not found:
        with hub_errors("listing devices"):
            known = sorted({d.name for d in client.get_devices()})
        raise EdgexError(f"AI Hub has no device {device!r} (known: {', '.join(known[:12]) or 'none'})")
    return HubConnection(device, path, client.config.api_url, float(settings.timeout_s))
