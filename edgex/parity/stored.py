"""What a written file stores, as the stored-tensor checks read it back: kept apart from both the
exporters that read their files and the checks that score them, so neither imports the other."""

from __future__ import annotations

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
