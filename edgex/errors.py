"""The one error type the library raises for bad input or a missing toolchain.

The CLI turns it into a one-line message and a non-zero exit; anything else is a bug and keeps its
traceback.
"""


class EdgexError(Exception):
    """A user-facing failure: the message says what was wrong and what to do."""


class GateFailed(EdgexError):
    """An artifact was exported but its parity is below the gate."""
