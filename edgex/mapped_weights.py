"""An eager model's weights moved into a private mapping of a file, so that forked jobs share them
as page cache instead of inheriting them as anonymous memory.

A job forked from the export (`edgex.isolation`) inherits every anonymous page of its parent in its
resident set at once, whether it reads them or not: a talker job carried the text embedding and the
vocoder it never touches. Pages of a private file mapping that nobody has written are not copied at
fork; a child maps in only the pages it reads, and the kernel can drop clean ones under pressure
and read them again. `torch.load(mmap=True)` makes such tensors; the file is unlinked as soon as
it is mapped, so nothing is left behind, whatever happens to the export afterwards.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import tempfile
from pathlib import Path

import torch
from torch import nn

from .resources import return_free_memory

# Smaller tensors stay where they are: their pages are few and often share a page with others.
MIN_BYTES = 1 << 20


def modules_in(models: object, depth: int = 2) -> list[nn.Module]:
    """The distinct top-level modules a recipe's `LoadedModel.models` holds: the object itself, or
    the modules among its fields (a dataclass, a dict, a list), one level down at most."""
    if isinstance(models, nn.Module):
        return [models]
    if depth == 0:
        return []
    if dataclasses.is_dataclass(models) and not isinstance(models, type):
        values = [getattr(models, f.name) for f in dataclasses.fields(models)]
    elif isinstance(models, dict):
        values = list(models.values())
    elif isinstance(models, (list, tuple)):
        values = list(models)
    else:
        values = list(vars(models).values()) if hasattr(models, "__dict__") else []
    found: dict[int, nn.Module] = {}
    for value in values:
        for module in modules_in(value, depth - 1):
            found.setdefault(id(module), module)
    return list(found.values())


def _large_tensors(modules: list[nn.Module]) -> tuple[list[torch.Tensor], list[tuple[dict, str, int]]]:
    """Every parameter and buffer of at least `MIN_BYTES`, each tensor object once however many
    modules share it (tied weights), and where each is held: (the owner's table, name, index)."""
    tensors: dict[int, int] = {}
    unique: list[torch.Tensor] = []
    places = []
    for top in modules:
        for owner in top.modules():
            for table in (owner._parameters, owner._buffers):
                for name, tensor in table.items():
                    if (tensor is None or tensor.layout != torch.strided or tensor.device.type != "cpu"
                            or tensor.untyped_storage().nbytes() < MIN_BYTES):
                        continue
                    if id(tensor) not in tensors:
                        tensors[id(tensor)] = len(unique)
                        unique.append(tensor)
                    places.append((table, name, tensors[id(tensor)]))
    return unique, places


def map_weights(models: object, folder: Path) -> int:
    """Move the large weights of the modules in `models` into a private mapping of a file written
    in `folder` (and unlinked at once). Parameters keep their identity (their `.data` is replaced),
    so every holder sees the mapped tensor. Returns the bytes moved: 0 where the file cannot be
    written (a full disk), the weights then staying where they were. The unlinked file's space on
    `folder`'s disk is freed when the process that mapped it ends."""
    unique, places = _large_tensors(modules_in(models))
    if not unique:
        return 0
    try:
        fd, name = tempfile.mkstemp(prefix=".weights-", suffix=".pt", dir=folder)
        os.close(fd)
    except OSError:
        return 0
    try:
        torch.save([tensor.detach() for tensor in unique], name)
        mapped = torch.load(name, mmap=True, weights_only=True)
    except (OSError, RuntimeError):  # torch's zip writer reports a short write as a RuntimeError
        return 0
    finally:
        Path(name).unlink(missing_ok=True)
    for tensor, copy in zip(unique, mapped):
        if isinstance(tensor, nn.Parameter):
            tensor.data = copy
    for table, attr, index in places:
        if not isinstance(table[attr], nn.Parameter):
            table[attr] = mapped[index]
    moved = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in mapped}.values())
    del unique, places, mapped
    gc.collect()
    return_free_memory()
    return moved
