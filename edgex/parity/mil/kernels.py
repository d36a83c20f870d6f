"""edgex's own kernels for MIL ops whose coremltools definition has no value semantics.

Each kernel takes the op's arguments as numpy values (defaults filled in by the op's definition)
and returns numpy outputs; the interpreter rounds them to the op's declared output dtypes.
Convolutions run in float32 and are rounded once per op in fp16 programs (Core ML's fp16 kernels
accumulate in wider precision too); elementwise kernels run in the program's own dtype.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

KERNELS: dict[str, Callable[[dict], tuple]] = {}


class KernelUnsupported(Exception):
    """The op is known but uses an argument combination these kernels do not implement."""


def kernel(op_type: str):
    def add(fn):
        KERNELS[op_type] = fn
        return fn

    return add


def _f32(x) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, np.float32))


def _conv_padding(a: dict, spatial: int) -> list[int]:
    """MIL `pad` as [begin_0, end_0, begin_1, end_1, ...]; only explicit and valid padding."""
    if a["pad_type"] == "valid":
        return [0] * (2 * spatial)
    if a["pad_type"] == "custom":
        return [int(p) for p in np.asarray(a["pad"]).reshape(-1)]
    raise KernelUnsupported(f"pad_type {a['pad_type']!r}")


def _product(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`np.matmul(x, y)` in the inputs' dtype, computed in float32 where that dtype is narrower:
    numpy multiplies fp16 matrices in a loop of its own, without BLAS (60x slower on a talker's
    layers), summing in float and rounding once as this does; the sums' order may move a result by
    one fp16 step."""
    dtype = np.result_type(x, y)
    if dtype.itemsize >= 4:
        return np.matmul(x, y)
    return np.matmul(np.asarray(x, np.float32), np.asarray(y, np.float32)).astype(dtype)


@kernel("linear")
def linear(a: dict) -> tuple:
    """coremltools' definition (the product, then the bias added in the result's dtype)."""
    out = _product(np.asarray(a["x"]), np.transpose(np.asarray(a["weight"])))
    if a.get("bias") is not None:
        out += a["bias"]
    return (out,)


@kernel("matmul")
def matmul(a: dict) -> tuple:
    x, y = np.asarray(a["x"]), np.asarray(a["y"])
    if a.get("transpose_x"):
        x = np.swapaxes(x, -1, -2)
    if a.get("transpose_y"):
        y = np.swapaxes(y, -1, -2)
    return (_product(x, y),)


_CONV = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d}
_CONV_T = {1: torch.nn.functional.conv_transpose1d, 2: torch.nn.functional.conv_transpose2d}


@kernel("conv")
def conv(a: dict) -> tuple:
    x, weight = _f32(a["x"]), _f32(a["weight"])
    spatial = x.ndim - 2
    if spatial not in _CONV:
        raise KernelUnsupported(f"{spatial}-d convolution")
    pads = _conv_padding(a, spatial)
    torch_pad = [p for axis in reversed(range(spatial)) for p in (pads[2 * axis], pads[2 * axis + 1])]
    x = torch.nn.functional.pad(x, torch_pad)
    bias = None if a.get("bias") is None else _f32(a["bias"])
    out = _CONV[spatial](x, weight, bias, stride=[int(s) for s in a["strides"]],
                         dilation=[int(d) for d in a["dilations"]], groups=int(a["groups"]))
    return (out.numpy(),)


@kernel("conv_transpose")
def conv_transpose(a: dict) -> tuple:
    """MIL pads crop the full transposed-convolution output: `begin` from the start, `end` from the
    end of each spatial axis."""
    x, weight = _f32(a["x"]), _f32(a["weight"])
    spatial = x.ndim - 2
    if spatial not in _CONV_T:
        raise KernelUnsupported(f"{spatial}-d transposed convolution")
    pads = _conv_padding(a, spatial)
    bias = None if a.get("bias") is None else _f32(a["bias"])
    out = _CONV_T[spatial](x, weight, bias, stride=[int(s) for s in a["strides"]],
                           dilation=[int(d) for d in a["dilations"]], groups=int(a["groups"]))
    index = [slice(None), slice(None)]
    for axis in range(spatial):
        size = out.shape[2 + axis]
        index.append(slice(pads[2 * axis], size - pads[2 * axis + 1]))
    out = out[tuple(index)]
    if a.get("output_shape") is not None and tuple(out.shape) != tuple(int(s) for s in a["output_shape"]):
        raise KernelUnsupported(f"output_shape {list(a['output_shape'])} differs from the padded result {list(out.shape)}")
    return (out.numpy(),)


@kernel("batch_norm")
def batch_norm(a: dict) -> tuple:
    """gamma (x - mean) / sqrt(variance + epsilon) + beta per channel (axis 1), in float32 (coremltools
    fuses a per-channel multiply and add into this op, e.g. ACT's folded ResNet norms)."""
    x = np.asarray(a["x"], np.float32)
    shape = (1, -1) + (1,) * (x.ndim - 2)

    def channel(name, default):
        value = a.get(name)
        return np.float32(default) if value is None else np.asarray(value, np.float32).reshape(shape)

    normed = (x - channel("mean", 0.0)) / np.sqrt(channel("variance", 1.0) + np.float32(a.get("epsilon", 1e-5)))
    return (normed * channel("gamma", 1.0) + channel("beta", 0.0),)


_MAX_POOL = {1: torch.nn.functional.max_pool1d, 2: torch.nn.functional.max_pool2d}


@kernel("max_pool")
def max_pool(a: dict) -> tuple:
    """Max pooling with MIL's explicit or valid padding (padded entries never win: -inf), in float32."""
    x = _f32(a["x"])
    spatial = x.ndim - 2
    if spatial not in _MAX_POOL:
        raise KernelUnsupported(f"{spatial}-d max_pool")
    pads = _conv_padding(a, spatial)
    torch_pad = [p for axis in reversed(range(spatial)) for p in (pads[2 * axis], pads[2 * axis + 1])]
    x = torch.nn.functional.pad(x, torch_pad, value=-np.inf)
    strides = a.get("strides")
    out = _MAX_POOL[spatial](x, [int(k) for k in a["kernel_sizes"]],
                             stride=[int(s) for s in strides] if strides is not None else 1, ceil_mode=bool(a["ceil_mode"]))
    return (out.numpy(),)


@kernel("silu")
def silu(a: dict) -> tuple:
    x = a["x"]
    return (x * (1 / (1 + np.exp(-x))),)


def _linear_along(x: np.ndarray, axis: int, size: int, align_corners: bool, half_pixel: bool) -> np.ndarray:
    """Linear interpolation of `x` to `size` samples along `axis`, on the grid MIL's
    `upsample_bilinear` defines (the spacing recomputed from the output size): corners aligned,
    half-pixel centres, or neither (grid points i * in / out)."""
    n = x.shape[axis]
    i = np.arange(size, dtype=np.float64)
    if align_corners:
        grid = i * ((n - 1) / (size - 1)) if size > 1 else np.zeros(size)
    elif half_pixel:
        grid = (i + 0.5) * (n / size) - 0.5
    else:
        grid = i * (n / size)
    grid = np.clip(grid, 0, n - 1)
    low = np.floor(grid).astype(np.int64)
    high = np.minimum(low + 1, n - 1)
    shape = [1] * x.ndim
    shape[axis] = size
    w = (grid - low).astype(np.float32).reshape(shape)
    return np.take(x, low, axis) * (1 - w) + np.take(x, high, axis) * w


@kernel("upsample_bilinear")
def upsample_bilinear(a: dict) -> tuple:
    """Bilinear upsampling of the last two axes by scale factors (output floor(size x factor)), in
    float32; `half_pixel_centers` (iOS 16) defaults to `not align_corners`."""
    x = np.asarray(a["x"], np.float32)
    align = bool(a["align_corners"])
    half = a.get("half_pixel_centers")
    half = (not align) if half is None else bool(half)
    height = int(np.floor(float(a["scale_factor_height"]) * x.shape[-2]))
    width = int(np.floor(float(a["scale_factor_width"]) * x.shape[-1]))
    x = _linear_along(x, x.ndim - 2, height, align, half)
    return (_linear_along(x, x.ndim - 1, width, align, half),)


def _reduction(reduce: Callable) -> Callable[[dict], tuple]:
    """coremltools' reduce definitions pass `keep_dims` to numpy as a numpy bool, which numpy 2
    refuses ("'numpy.bool' object cannot be interpreted as an integer"): the same reduction with
    plain Python arguments, in the program's dtype."""

    def run(a: dict) -> tuple:
        x = np.asarray(a["x"])
        axes = None if a.get("axes") is None else tuple(int(i) for i in np.asarray(a["axes"]).reshape(-1))
        return (np.asarray(reduce(x, axis=axes, keepdims=bool(a["keep_dims"]))).astype(x.dtype),)

    return run


for _name, _reduce in (("reduce_mean", np.mean), ("reduce_sum", np.sum), ("reduce_max", np.max),
                       ("reduce_min", np.min), ("reduce_prod", np.prod)):
    KERNELS[_name] = _reduction(_reduce)


_DECOMPRESSORS = {  # iOS 18 constexpr op -> the arguments of its coremltools `decompress`
    "constexpr_blockwise_shift_scale": ("data", "scale", "offset"),
    "constexpr_lut_to_dense": ("indices", "lut", "vector_axis"),
    "constexpr_sparse_to_dense": ("nonzero_data", "mask"),
}


def _decompressor(op_type: str, arguments: tuple[str, ...]) -> Callable[[dict], tuple]:
    """A constexpr op evaluated by its coremltools definition's own `decompress` (the program's
    dequantization), applied to the raw stored data rather than to any value folded at load time."""

    def run(a: dict) -> tuple:
        from coremltools.converters.mil.mil.ops.defs.iOS18 import compression

        return (getattr(compression, op_type).decompress(*(a.get(n) for n in arguments)),)

    return run


for _op, _arguments in _DECOMPRESSORS.items():
    KERNELS[_op] = _decompressor(_op, _arguments)
