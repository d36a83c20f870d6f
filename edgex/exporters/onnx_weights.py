"""Writing an ONNX graph's transposed weights at memory speed.

The ONNX exporter gives each `nn.Linear` a `Transpose` of its weight, which onnxscript's constant
folding replaces by the transposed initializer: a NumPy view of the weight with swapped strides,
not a copy. onnx_ir writes such an array with `ndarray.tofile`, which walks a non-contiguous array
element by element; a transformer's weights are almost all of this kind. Copied into row-major
order by torch's blocked transpose, one weight at a time as the file is written, the same bytes
reach the file three times faster and no weight is held twice for longer than its own write.

This module imports onnx_ir and torch: import it where an ONNX graph is saved.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import torch

# NumPy dtypes whose bytes torch copies as they are (the rest keep onnx_ir's own writer)
_COPIED_BY_TORCH = {np.dtype(t) for t in (np.float32, np.float16, np.float64, np.int64, np.int32, np.int8, np.uint8)}


class _RowMajorOnWrite(ir.Tensor):
    """An initializer backed by a strided NumPy view, written as its row-major copy."""

    def tofile(self, file) -> None:
        file.write(memoryview(torch.from_numpy(self.raw).contiguous().numpy()).cast("B"))


def write_strided_weights_row_major(model: ir.Model) -> int:
    """Let every initializer of `model` that is a strided NumPy view be written through
    `_RowMajorOnWrite`. Values, names and the saved bytes are unchanged; returns how many."""
    count = 0
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            raw = getattr(tensor, "raw", None)
            if type(tensor) is ir.Tensor and isinstance(raw, np.ndarray) and not raw.flags.c_contiguous \
                    and raw.dtype in _COPIED_BY_TORCH and raw.dtype.byteorder in "=|<":
                value.const_value = _RowMajorOnWrite(raw, tensor.dtype, shape=tensor.shape, name=tensor.name,
                                                     doc_string=tensor.doc_string, metadata_props=tensor.metadata_props)
                count += 1
    return count
