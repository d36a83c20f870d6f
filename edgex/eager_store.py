"""Eager results kept on disk between processes, named by the sha256 of everything they are a function of.

Parity samples come from running the eager model step by step (Qwen3-TTS: utterances of talker
frames, each sampling 15 codes through the official code predictor). At the tiny preset that is most
of what an export of one small graph costs beside its lowering, and every export, verify and sweep
point of the same model repeats it. A stored result is the eager code's own output, computed once and
read back bit for bit, so a run that finds it and a run that computes it score the same samples.

The key holds what `edgex.artifacts.keys` puts in an artifact's key for the eager side: edgex's source,
the Python version, the machine and its CPU features (`environment`), the versions of the packages
the eager code runs, plus the bytes of every tensor and the config of the modules the computation
reads (so weights made any way, a preset, a checkpoint or a model changed in memory, key themselves)
and the computation's own arguments. Outside the key, as there: the eager thread count (reductions
in another order move the last bits). Code patched at run time is not seen by the key: a caller that
patches the eager code it runs does not use the store.

Entries go under `edgex.progress.cache_dir()` / `eager`, written to a temporary file and renamed, and
are read with `torch.load(weights_only=True)` (tensors, numbers, lists and dicts only). Results larger
than `MAX_BYTES` are not stored: beside a real-size export the eager steps are a small part of the
time, and their caches would be tens of MB each.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch

MAX_BYTES = 32 << 20
FOLDER = "eager"


def module_digest(module: torch.nn.Module) -> str:
    """sha256 of a module's state (every parameter and buffer: name, dtype, shape, bytes) and of its
    config where it has one (values derived from it, such as RoPE frequencies, are not in the state)."""
    digest = hashlib.sha256()
    config = getattr(module, "config", None)
    if config is not None and hasattr(config, "to_json_string"):
        digest.update(config.to_json_string(use_diff=False).encode())
    for name, tensor in module.state_dict(keep_vars=False).items():
        t = tensor.detach().contiguous().cpu()
        digest.update(f"{name}\0{t.dtype}\0{tuple(t.shape)}\n".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def entry_key(kind: str, inputs: dict, packages: tuple[str, ...]) -> str:
    from .artifacts.keys import environment, package_versions

    whole = {"kind": kind, "environment": environment(), "packages": package_versions(("torch", "numpy", *packages)),
             "inputs": inputs}
    return hashlib.sha256(json.dumps(whole, sort_keys=True, default=str).encode()).hexdigest()


def _path(key: str) -> Path:
    from .progress import cache_dir

    return cache_dir() / FOLDER / f"{key}.pt"


def load(key: str) -> dict | None:
    """The stored result, or None (absent or unreadable: it is computed again)."""
    path = _path(key)
    if not path.is_file():
        return None
    try:
        return torch.load(path, weights_only=True)
    except Exception:  # a truncated or foreign file: computed again and written over
        return None


def save(key: str, state: dict) -> bool:
    """Store `state` (tensors, numbers, lists, dicts) under `key` unless it is larger than `MAX_BYTES`
    or the cache folder cannot be written; whether it was stored."""
    if _bytes(state) > MAX_BYTES:
        return False
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
        os.replace(tmp, path)
    except OSError:
        return False
    return True


def stored(key: str, compute: Callable[[], dict]) -> dict:
    """The result under `key`, computed by `compute()` and stored when absent."""
    state = load(key)
    if state is None:
        state = compute()
        save(key, state)
    return state


def _bytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_bytes(v) for v in value)
    return 8
