"""Writing an ONNX graph's transposed weights at memory speed.

The ONNX exporter gives each `nn.Linear` a `Transpose` of its weight, which onnxscript's constant
folding replaces by the transposed initializer: a NumPy view of the weight with swapped strides,
not a copy. onnx_ir writes such an array with `ndarray.tofile`, which walks a non-contiguous array
element by element; a transformer's weights are almost all of this kind. Copied into row-major
order by torch's blocked transpose, one weight at a time as the file is written, the same bytes
reach the file at the pace of a memory copy, and no weight is held twice for longer than its own
write.

This module is light: numpy, onnx_ir and torch are imported inside.
"""

from __future__ import annotations

from functools import cache

# NumPy dtype names whose bytes torch copies as they are (the rest keep onnx_ir's own writer)
_COPIED_BY_TORCH = frozenset({"float32", "float16", "float64", "int64", "int32", "int8", "uint8"})


@cache
def _row_major_on_write() -> type:
    """An onnx_ir tensor backed by a strided NumPy view, written as its row-major copy."""
    import onnx_ir as ir
    import torch

    class RowMajorOnWrite(ir.Tensor):
        def tofile(self, file) -> None:
            file.write(memoryview(torch.from_numpy(self.raw).contiguous().numpy()).cast("B"))

    return RowMajorOnWrite


def write_strided_weights_row_major(model) -> int:
    """Let every initializer of the onnx_ir `model` that is a strided NumPy view be written through
    `_row_major_on_write`. Values, names and the saved bytes are unchanged; returns how many."""
    import numpy as np
    import onnx_ir as ir

    count = 0
    for graph in model.graphs():
        for value in graph.initializers.values():
            tensor = value.const_value
            raw = getattr(tensor, "raw", None)
            if type(tensor) is ir.Tensor and isinstance(raw, np.ndarray) and not raw.flags.c_contiguous \
                    and raw.dtype.name in _COPIED_BY_TORCH and raw.dtype.byteorder in "=|<":
                value.const_value = _row_major_on_write()(raw, tensor.dtype, shape=tensor.shape, name=tensor.name,
                                                          doc_string=tensor.doc_string,
                                                          metadata_props=tensor.metadata_props)
                count += 1
    return count
