"""An eager model's weights moved into a private mapping of a file, so that forked jobs share them
as page cache instead of inheriting them as anonymous memory.

A job forked from the export (`edgex.isolation`) inherits every anonymous page of its parent in its
resident set at once, whether it reads them or not: a talker job carried the text embedding and the
vocoder it never touches. Pages of a private file mapping that nobody has written are not copied at
fork; a child maps in only the pages it reads, and the kernel can drop clean ones under pressure
and read them again (the mapping `torch.load(mmap=True)` makes, here of the storages' bytes as
they are). The file is unlinked as soon as it is mapped, so nothing is left behind, whatever
happens to the export afterwards.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import tempfile
import threading
from pathlib import Path
from typing import Callable

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


ALIGN = 64  # byte alignment of each storage in the file (any dtype's elements, SIMD loads)


def _write_storages(storages: list[torch.UntypedStorage], name: str) -> list[int]:
    """Each storage's bytes at its own aligned offset of file `name`; the offsets. The bytes as they
    are: `torch.save`'s archive computes a CRC over every record, most of the time of writing it."""
    offsets, end = [], 0
    with open(name, "wb") as f:
        for storage in storages:
            offset = -(-end // ALIGN) * ALIGN
            f.seek(offset)
            f.write(memoryview(torch.empty(0, dtype=torch.uint8).set_(storage).numpy()))
            offsets.append(offset)
            end = offset + storage.nbytes()
    return offsets


def map_weights(models: object, folder: Path, meanwhile: Callable[[], object] | None = None) -> int:
    """Move the large weights of the modules in `models` into a private mapping of a file written
    in `folder` (and unlinked at once). Parameters keep their identity (their `.data` is replaced),
    so every holder sees the mapped tensor; tensors that shared a storage share its mapped copy,
    at the same offsets and strides. Returns the bytes moved: 0 where the file cannot be
    written (a full disk), the weights then staying where they were. The unlinked file's space on
    `folder`'s disk is freed when the process that mapped it ends.

    `meanwhile` runs in the calling thread while another writes the file (gigabytes the kernel
    copies into the page cache, most of the time here): work that does not touch the weights."""
    unique, places = _large_tensors(modules_in(models))
    if not unique:
        if meanwhile is not None:
            meanwhile()
        return 0
    storages: dict[int, torch.UntypedStorage] = {}
    for tensor in unique:
        storages.setdefault(tensor.untyped_storage().data_ptr(), tensor.untyped_storage())
    try:
        fd, name = tempfile.mkstemp(prefix=".weights-", suffix=".bin", dir=folder)
        os.close(fd)
    except OSError:
        return 0
    written: list = []

    def write() -> None:
        try:
            written.append(_write_storages(list(storages.values()), name))
        except (OSError, RuntimeError) as exc:  # a full disk, or a storage numpy cannot view
            written.append(exc)

    writer = threading.Thread(target=write, name="edgex-map-weights", daemon=True)
    try:
        writer.start()
        if meanwhile is not None:
            meanwhile()
        writer.join()
        offsets = written[0]
        if isinstance(offsets, Exception):
            return 0
        size = offsets[-1] + list(storages.values())[-1].nbytes()
        whole = torch.UntypedStorage.from_file(name, shared=False, nbytes=size)  # a private mapping
    except (OSError, RuntimeError):
        return 0
    finally:
        writer.join()
        Path(name).unlink(missing_ok=True)
    copies = {key: whole[offset : offset + storage.nbytes()]
              for (key, storage), offset in zip(storages.items(), offsets)}
    mapped = [torch.empty(0, dtype=t.dtype).set_(copies[t.untyped_storage().data_ptr()], t.storage_offset(), t.shape, t.stride())
              for t in unique]
    for tensor, copy in zip(unique, mapped):
        if isinstance(tensor, nn.Parameter):
            tensor.data = copy
    for table, attr, index in places:
        if not isinstance(table[attr], nn.Parameter):
            table[attr] = mapped[index]
    moved = size
    del unique, places, mapped, storages, copies
    gc.collect()
    return_free_memory()
    return moved
