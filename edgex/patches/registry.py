"""The registry of patches (`edgex.patches` says what a patch is): `register`, the switch, and
what was applied in this process."""

from __future__ import annotations

import inspect
import os
from collections import Counter
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from functools import wraps
from typing import Callable, ContextManager

SWITCH = "EDGEX_THIRD_PARTY_PATCHES"  # "off" runs every library as it ships
SPEED_UP, REQUIRED, READ = "speed-up", "required", "read"


@dataclass(frozen=True)
class Patch:
    name: str
    kind: str  # SPEED_UP, REQUIRED or READ
    symbols: tuple[str, ...]  # what it replaces or reads, dotted
    checked: dict[str, str]  # distribution -> the version the patch was checked against
    saves: str  # what it saves, measured (SPEED_UP), or what it makes possible (REQUIRED)
    no_op: str  # when it changes nothing
    upstream: str = ""  # what would make it unnecessary upstream


PATCHES: dict[str, Patch] = {}
APPLIED: Counter = Counter()  # patch name -> how many times it was applied in this process


def enabled() -> bool:
    """Whether speed-ups are on (`EDGEX_THIRD_PARTY_PATCHES` is anything but `off`)."""
    return os.environ.get(SWITCH, "on").strip().lower() != "off"


def switch_environment() -> dict[str, str]:
    """The switch as this process has it, spelled out (`on` where it is unset), for a process that
    does not inherit this one's environment: a Ray task on a cluster's node (`env_vars` of its
    `runtime_env`) runs the libraries as the driver would."""
    return {SWITCH: "on" if enabled() else "off"}


def register(name: str, *, kind: str, symbols: tuple[str, ...], checked: dict[str, str], saves: str, no_op: str,
             upstream: str = "") -> Callable:
    """Register the function below it as patch `name`: a generator function, made a context manager
    (which does nothing while the switch is off, for a `SPEED_UP`), or any other function as it is
    (a `READ` that calls the private symbols, a `REQUIRED` that installs something once)."""
    if kind not in (SPEED_UP, REQUIRED, READ):
        raise ValueError(f"patch kind {kind!r}")

    def add(function: Callable[..., object]) -> Callable[..., ContextManager]:
        if name in PATCHES:
            raise RuntimeError(f"patch {name!r} registered twice")
        PATCHES[name] = Patch(name, kind, symbols, dict(checked), saves, no_op, upstream)
        if not inspect.isgeneratorfunction(function):
            if kind == SPEED_UP:
                raise TypeError(f"speed-up {name!r} must be a context manager, to be switched off")
            function.patch = PATCHES[name]
            return function

        @contextmanager
        @wraps(function)
        def counted(*args, **kwargs):
            APPLIED[name] += 1
            yield from function(*args, **kwargs)

        @wraps(function)
        def applied(*args, **kwargs) -> ContextManager:
            if kind == SPEED_UP and not enabled():
                return nullcontext()
            return counted(*args, **kwargs)

        applied.patch = PATCHES[name]
        return applied

    return add
