"""An independent weight quantizer, written from each format's own definition of its scheme.

A quantized artifact's weights are checked against this module, never against the exporter's
quantization code (torchao, ONNX Runtime's quantizers, gguf-py, coremltools, MNN's converter): a
bug there would otherwise be on both sides of the comparison and cancel. Nothing here imports
those libraries. Each scheme is data (`WeightScheme`): code range, where the scale comes from,
whether a zero point is stored, how values round and in what precision the scale is stored.

Layout: a weight is handled as rows of output channels, reduced along its last axis (a linear
layer's [out, in]); a scale covers `block` consecutive values of a row, or the whole row when
`block` is None (per channel). Readers hand the stored tensor over in that layout.

The schemes, each from the format's own documentation or reference implementation:

- ggml Q8_0 / Q4_0 (ggml-quants.c `quantize_row_q8_0_ref` / `_q4_0_ref`): blocks of 32, one fp16
  scale each. Q8_0: d = absmax / 127, q = roundf(x / d) (half away from zero). Q4_0: d = the
  block's signed value of largest magnitude / -8, q = min(15, trunc(x / d + 8.5)), stored
  unsigned with an implied zero point of 8. The codes use the fp32 scale; the file keeps fp16.
- ONNX Runtime MatMulNBits (MLAS `MlasQuantizeBlockwise`): blocks of 32 along the input. Symmetric:
  scale = signed max / -2^(b-1), zero point 2^(b-1); asymmetric: range widened to include 0,
  scale = range / (2^b - 1), zero point roundf(-min / scale); q = roundf(x / scale) + zero point,
  clamped to [0, 2^b - 1]. Scales fp32.
- ONNX QDQ (QuantizeLinear as the ONNX spec defines it: round half to even, saturate; scale and
  zero point as ONNX Runtime's static quantizer derives them, `compute_scale_zp`): per channel or
  per tensor, range widened to include 0 and, for the HTP, to at least 1e-4 (its
  `min_real_range`); asymmetric uint8 [0, 255] with zero point round(qmin - min / scale);
  symmetric (range made [-absmax, absmax], scale 2 absmax / (qmax - qmin), zero point
  round((qmin + qmax) / 2)) int4 [-8, 7] at 0, every per-channel constant (uint8 [0, 255] at 128),
  and int8 [-127, 127] at 0. Scales fp32.
- torchao's affine weight quantization as ExecuTorch's 8da8w / 8da4w use it (symmetric
  `choose_qparams_affine`): scale = absmax / ((qmax - qmin) / 2), codes round-half-even in
  [-128, 127] per channel (int8) or [-8, 7] per group of 32 (int4). The codes use the fp32 scale;
  the `.pte`'s XNNPACK delegate keeps per-channel scales in fp32 and per-group scales in bfloat16
  (ExecuTorch's XNNPACK serializer casts them).
- Core ML `constexpr_blockwise_shift_scale`, linear symmetric (coremltools' documented mode):
  int8 [-127, 127] per output channel, int4 [-7, 7] in blocks of 32; scale = absmax / qmax,
  round half to even; the program is fp16, so weights and scales are fp16.
- MNN's weight quantization (the converter's documented asymmetric min / max per channel, or
  per block of 32 for int4): each row or block mapped from [min, max] onto 2^b levels, no zero
  forced into the range, stored as code x scale + min.

The figures a stored tensor must reach are relative to what this module computes for the same
eager weight (`edgex.parity.quantized`): exact codes where the scheme is deterministic, within
rounding where the format's arithmetic differs from this module's (fp16 arithmetic in Core ML).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HALF_EVEN = "half_even"  # numpy / torch round, ONNX QuantizeLinear
HALF_AWAY = "half_away"  # C roundf
HALF_UP = "half_up"  # trunc(x + 0.5) of non-negative values (ggml Q4_0 after its +8 shift)

ABSMAX = "absmax"  # scale = absmax / divisor, zero point 0 (or `offset` stored with unsigned codes)
SIGNED_MAX = "signed_max"  # scale = (value of largest magnitude, sign kept) / divisor (ggml Q4_0, MLAS symmetric)
RANGE_WITH_ZERO = "range_with_zero"  # [min(min, 0), max(max, 0)] onto [qmin, qmax], integer zero point
RANGE = "range"  # [min, max] onto [0, 2^b - 1], stored as code x scale + min (no integer zero point)
# [-absmax, absmax] of the range widened to include 0 onto [qmin, qmax], zero point round((qmin + qmax) / 2)
SYMMETRIC_RANGE = "symmetric_range"


@dataclass(frozen=True)
class WeightScheme:
    """How one format quantizes a weight (see the module docstring for the sources)."""

    name: str
    bits: int
    qmin: int
    qmax: int
    scale_rule: str  # ABSMAX | SIGNED_MAX | RANGE_WITH_ZERO | SYMMETRIC_RANGE | RANGE
    divisor: float = 1.0  # ABSMAX / SIGNED_MAX: scale = value / divisor
    offset: int = 0  # codes stored as q + offset (an implied zero point)
    block: int | None = None  # values per scale along the last axis; None: one scale per row
    rounding: str = HALF_EVEN
    scale_dtype: str = "float32"  # the precision the file stores scales in
    codes_from_stored_scale: bool = True  # False: codes use the fp32 scale, the file keeps it rounded (ggml)
    weight_dtype: str = "float32"  # the precision the format quantizes and dequantizes in (Core ML: fp16 programs)
    exact: bool = True  # the format's quantizer is deterministic to this definition: codes must agree
    min_range: float = 0.0  # RANGE_WITH_ZERO / SYMMETRIC_RANGE: the range is widened to at least this (max = min + min_range)

    @property
    def zero_point(self) -> bool:
        return self.scale_rule in (RANGE_WITH_ZERO, SYMMETRIC_RANGE)


def _round(x: np.ndarray, rounding: str) -> np.ndarray:
    if rounding == HALF_EVEN:
        return np.round(x)
    if rounding == HALF_AWAY:
        return np.sign(x) * np.floor(np.abs(x) + 0.5)
    return np.floor(x + 0.5)


def _cast(x: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":  # round to nearest even on the top 16 bits
        bits = x.astype(np.float32).view(np.uint32)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
        return bits.view(np.float32)
    return x.astype(np.float32)


@dataclass
class Quantized:
    codes: np.ndarray  # integers as the file stores them (offset included), [rows, blocks, block]
    scale: np.ndarray  # [rows, blocks, 1], as the file stores it (decoded to float32)
    zero: np.ndarray  # [rows, blocks, 1]: integer zero point, or the block minimum for RANGE
    shape: tuple

    def dequantize(self, scheme: WeightScheme) -> np.ndarray:
        dtype = np.float16 if scheme.weight_dtype == "float16" else np.float32
        codes, scale, zero = (a.astype(dtype) for a in (self.codes, self.scale, self.zero))
        values = codes * scale + zero if scheme.scale_rule == RANGE else (codes - zero) * scale
        return values.reshape(self.shape).astype(np.float32)


def quantize(weight: np.ndarray, scheme: WeightScheme) -> Quantized:
    """`weight` [..., in] (rows = every axis but the last) quantized as `scheme` defines it."""
    w = np.asarray(weight, np.float32)
    shape = w.shape
    rows = w.reshape(-1, shape[-1]) if w.ndim > 1 else w.reshape(1, -1)
    block = scheme.block or rows.shape[1]
    if rows.shape[1] % block:
        raise ValueError(f"{scheme.name}: a row of {rows.shape[1]} values is not a whole number of blocks of {block}")
    if scheme.weight_dtype == "float16":  # everything in fp16 arithmetic, as an fp16 program's compressor does
        return _quantize_fp16(rows.reshape(rows.shape[0], -1, block).astype(np.float16), scheme, shape)
    blocks = rows.reshape(rows.shape[0], -1, block)
    low, high = blocks.min(-1, keepdims=True), blocks.max(-1, keepdims=True)
    zero = np.zeros_like(low)
    if scheme.scale_rule == ABSMAX:
        scale = np.maximum(-low, high) / np.float32(scheme.divisor)
    elif scheme.scale_rule == SIGNED_MAX:
        scale = np.where(-low > high, low, high) / np.float32(scheme.divisor)
    elif scheme.scale_rule in (RANGE_WITH_ZERO, SYMMETRIC_RANGE):
        low, high = np.minimum(low, 0), np.maximum(high, 0)
        if scheme.min_range:
            high = np.maximum(high, low + np.float32(scheme.min_range))
        if scheme.scale_rule == SYMMETRIC_RANGE:
            high = np.maximum(-low, high)
            low = -high
        scale = ((high.astype(np.float64) - low) / (scheme.qmax - scheme.qmin)).astype(np.float32)
    else:  # RANGE
        scale = (high - low) / np.float32(scheme.qmax - scheme.qmin)
        zero = low
    stored_scale = _cast(scale, scheme.scale_dtype)
    used = stored_scale if scheme.codes_from_stored_scale else scale
    with np.errstate(divide="ignore", invalid="ignore"):
        if scheme.scale_rule == RANGE_WITH_ZERO:
            zero = np.clip(_round(scheme.qmin - low.astype(np.float64) / used, scheme.rounding), scheme.qmin, scheme.qmax)
            zero = np.where(used > 0, zero, 0).astype(np.float32)
            scaled = blocks / used
        elif scheme.scale_rule == SYMMETRIC_RANGE:
            zero = np.full_like(low, np.round((scheme.qmin + scheme.qmax) / 2.0))
            scaled = blocks / used
        elif scheme.scale_rule == RANGE:
            scaled = (blocks - low) / used
        else:  # a reciprocal, as the C reference implementations multiply by it
            scaled = blocks * np.where(used != 0, np.float32(1) / used, 0).astype(np.float32)
    scaled = np.where(np.isfinite(scaled), scaled, 0)
    codes = np.clip(_round(scaled, scheme.rounding) + (zero if scheme.zero_point else 0), scheme.qmin, scheme.qmax)
    stored_zero = zero + scheme.offset if scheme.scale_rule != RANGE else zero
    return Quantized((codes + scheme.offset).astype(np.int32), stored_scale, stored_zero.astype(np.float32), shape)


def _quantize_fp16(blocks: np.ndarray, scheme: WeightScheme, shape: tuple) -> Quantized:
    """ABSMAX in half precision: scale = (absmax - (-absmax)) / (qmax - qmin), codes round(w / scale),
    every step rounded to fp16 (coremltools' linear-symmetric mode on an fp16 program)."""
    if scheme.scale_rule != ABSMAX:
        raise ValueError(f"{scheme.name}: fp16 arithmetic is defined for symmetric (absmax) schemes only")
    absmax = np.maximum(np.abs(blocks.min(-1, keepdims=True)), np.abs(blocks.max(-1, keepdims=True)))
    scale = (absmax - (-absmax)) / np.float16(scheme.qmax - scheme.qmin)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = blocks / scale
    codes = np.clip(_round(np.where(np.isfinite(scaled), scaled, 0), scheme.rounding), scheme.qmin, scheme.qmax)
    return Quantized(codes.astype(np.int32), scale.astype(np.float32), np.zeros(scale.shape, np.float32), shape)


def fake_quantize(weight: np.ndarray, scheme: WeightScheme) -> np.ndarray:
    """What a file following `scheme` stores for `weight`, dequantized to float32."""
    return quantize(weight, scheme).dequantize(scheme)


def _ggml_q4_0() -> WeightScheme:
    return WeightScheme("ggml Q4_0", 4, -8, 7, SIGNED_MAX, divisor=-8.0, offset=8, block=32, rounding=HALF_UP,
                        scale_dtype="float16", codes_from_stored_scale=False)


# (exporter, precision) -> the scheme its files store for a quantized 2-D weight. QNN's schemes
# depend on the weight type the file records (`qdq_scheme`).
SCHEMES: dict[tuple[str, str], WeightScheme] = {
    ("gguf", "q8_0"): WeightScheme("ggml Q8_0", 8, -127, 127, ABSMAX, divisor=127.0, block=32, rounding=HALF_AWAY,
                                   scale_dtype="float16", codes_from_stored_scale=False),
    ("gguf", "q4_0"): _ggml_q4_0(),
    ("onnx", "8da8w"): WeightScheme("MatMulNBits int8, symmetric blocks of 32", 8, -128, 127, SIGNED_MAX, divisor=-128.0,
                                    offset=128, block=32, rounding=HALF_AWAY),
    ("onnx", "8da4w"): WeightScheme("MatMulNBits int4, blocks of 32 with zero points", 4, 0, 15, RANGE_WITH_ZERO, block=32,
                                    rounding=HALF_AWAY),
    ("executorch", "8da8w"): WeightScheme("torchao int8 symmetric per channel", 8, -128, 127, ABSMAX, divisor=127.5),
    ("executorch", "8da4w"): WeightScheme("torchao int4 symmetric per group of 32, bfloat16 scales", 4, -8, 7, ABSMAX, divisor=7.5,
                                          block=32, scale_dtype="bfloat16", codes_from_stored_scale=False),
    ("coreml", "w8"): WeightScheme("Core ML linear symmetric int8 per channel", 8, -127, 127, ABSMAX,
                                   scale_dtype="float16", weight_dtype="float16"),
    ("coreml", "w4"): WeightScheme("Core ML linear symmetric int4 in blocks of 32", 4, -7, 7, ABSMAX, block=32,
                                   scale_dtype="float16", weight_dtype="float16"),
    ("mnn", "w8"): WeightScheme("MNN asymmetric int8 per channel", 8, 0, 255, RANGE),
    ("mnn", "w4"): WeightScheme("MNN asymmetric int4 in blocks of 32", 4, 0, 15, RANGE, block=32),
}

# ONNX QDQ weight types (QuantizeLinear's output type) -> the scheme ONNX Runtime's static quantizer
# gives a per-tensor constant for the HTP (`QDQ_SCHEMES`) and a per-channel one (`QDQ_CHANNEL_SCHEMES`):
# per tensor, uint8 asymmetric and int4 symmetric (edgex asks for symmetric int4 weights, which the
# HTP needs: `exporters/qnn.py`), int8 symmetric; per channel, always symmetric (ONNX Runtime's
# `QDQQuantizer` makes every per-channel initializer symmetric: uint8 at zero point 128, int4 at 0,
# int8 on [-127, 127]). The HTP needs a range of at least 1e-4 (the QNN quantizer config's
# `MinimumRealRange`), applied before the range is made symmetric: a constant of smaller range, an
# RMSNorm's eps of 1e-6, is stored at scale 1e-4 / (qmax - qmin) (uint8: code 3 for 1e-6, 1.18e-6).
QNN_MIN_RANGE = 1e-4
_QDQ_INT8 = WeightScheme("QDQ int8 symmetric", 8, -127, 127, ABSMAX, divisor=127.0)
_QDQ_INT4 = WeightScheme("QDQ int4 symmetric", 4, -8, 7, SYMMETRIC_RANGE, min_range=QNN_MIN_RANGE)
QDQ_SCHEMES = {
    "uint8": WeightScheme("QDQ uint8 asymmetric", 8, 0, 255, RANGE_WITH_ZERO, min_range=QNN_MIN_RANGE),
    "int4": _QDQ_INT4,
    "int8": _QDQ_INT8,
}
QDQ_CHANNEL_SCHEMES = {
    "uint8": WeightScheme("QDQ uint8 symmetric per channel", 8, 0, 255, SYMMETRIC_RANGE, min_range=QNN_MIN_RANGE),
    "int4": _QDQ_INT4,
    "int8": _QDQ_INT8,
}


def scheme_for(exporter: str, precision: str) -> WeightScheme | None:
    return SCHEMES.get((exporter, precision))


def with_block(scheme: WeightScheme, block: int | None) -> WeightScheme:
    """The same scheme with one scale per `block` values (None: per row): a format that falls back
    to per channel where a row is not a whole number of blocks (MNN's converter) says so per tensor."""
    from dataclasses import replace

    return replace(scheme, block=block)
