"""Ray: the settings an embedded Ray instance starts with, undone when it stops.

This module is light: Ray is imported inside.
"""

from __future__ import annotations

import os

from .registry import REQUIRED, register

_LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # node address 127.0.0.1, not the outward one


@register("ray.settings", kind=REQUIRED, checked={"ray": "2.60.0"},
          symbols=("ray._private.ray_constants.ENABLE_RAY_CLUSTER",),
          saves="an embedded Ray whose node address, and so every listening socket, is loopback "
                "(`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, and the constant Ray read from it where Ray was imported "
                "before it was set); usage statistics off unless the environment says otherwise",
          no_op="a Ray this process had already started is used as it is; a cluster address sets only the "
                "usage statistics default")
def ray_settings(embedded: bool):
    """Ray's environment (and, for an embedded instance, `ray_constants.ENABLE_RAY_CLUSTER`) set for
    the duration, and all of it as it was after: an application that calls edgex keeps its Ray."""
    values = {"RAY_USAGE_STATS_ENABLED": os.environ.get("RAY_USAGE_STATS_ENABLED", "0"),
              **(_LOOPBACK if embedded else {})}
    saved_env = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    constants, saved = None, None
    try:
        if embedded:
            try:
                from ray._private import ray_constants as constants  # reads the variable when first imported
            except ImportError:
                constants = None  # no Ray: the caller says so
            else:
                saved = constants.ENABLE_RAY_CLUSTER
                constants.ENABLE_RAY_CLUSTER = False  # as the variable, where Ray was imported before it was set
        yield
    finally:
        if constants is not None:
            constants.ENABLE_RAY_CLUSTER = saved
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
