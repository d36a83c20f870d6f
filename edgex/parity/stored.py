"""What a written file stores, as the stored-tensor checks read it back: kept apart from both the
exporters that read their files and the checks that score them, so neither imports the other."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


@dataclass
class StoredTensor:
    """One tensor as a written file stores it, dequantized to float32, and the eager weight it
    stands for (None where the file holds a tensor the component does not declare, or lacks one).
    `rows`: a gather table, scored row by row. `readable` False: the format cannot be read back
    here, so the tensor is unverified (`type` says why)."""

    type: str
    stored: np.ndarray | None
    original: np.ndarray | None
    rows: bool = False
    readable: bool = True


class ReadOnDemand(Mapping):
    """Stored tensors by name, each read back from its file when it is looked up, never kept: a
    check that scores them one at a time (`edgex.parity.tensors.tensor_parity`) holds one tensor and
    its eager weight at once instead of every weight of a file twice (a 0.6b talker's `.dlc` check held
    3.7 GB so). `read(name)` makes the `StoredTensor`; `names` in the order the check reports them."""

    def __init__(self, names: list[str], read: Callable[[str], StoredTensor]):
        self._names, self._read = dict.fromkeys(names), read

    def __getitem__(self, name: str) -> StoredTensor:
        if name not in self._names:
            raise KeyError(name)
        return self._read(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
