"""Named numeric schemes. Each exporter maps a scheme to its native mechanism or refuses it."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import EdgexError


@dataclass(frozen=True)
class Precision:
    name: str
    weights: str  # storage of linear weights
    activations: str  # compute / activation type
    granularity: str  # how weights are quantized
    calibration: bool  # needs representative activations
    description: str


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in (
        Precision("fp32", "float32", "float32", "-", False, "reference float"),
        Precision("fp16", "float16", "float16", "-", False, "half precision weights and compute (MNN: weights only; see schemes per format)"),
        Precision("8da8w", "int8", "int8 dynamic", "per channel", False, "int8 weights, per-token dynamic int8 activations"),
        Precision("8da4w", "int4", "int8 dynamic", "groups of 32", False, "int4 group-wise weights, dynamic int8 activations"),
        Precision("w8", "int8", "float32", "per channel", False, "int8 weight-only, float compute"),
        Precision("w4", "int4", "float32", "blocks of 32", False, "int4 block-wise weight-only, float compute"),
        Precision("w8a16", "uint8", "uint16 static", "per tensor (MatMul), per channel (Conv)", True, "uint8 weights, calibrated uint16 activations (HTP)"),
        Precision("w4a16", "int4", "uint16 static", "per tensor (MatMul), per channel (Conv)", True, "int4 weights, calibrated uint16 activations (HTP)"),
        Precision("w8a8", "uint8", "uint8 static", "per tensor (MatMul), per channel (Conv)", True, "uint8 weights, calibrated uint8 activations (HTP)"),
        Precision("f32", "float32", "float32", "-", False, "GGUF F32 weights (conv kernels F16, as llama.cpp's converter writes them); llama.cpp's fp32 kernels"),
        Precision("f16", "float16", "float32", "-", False, "GGUF F16 weights (llama.cpp computes in fp32)"),
        Precision("q8_0", "int8", "float32", "blocks of 32, fp16 scale", False, "GGUF Q8_0: llama.cpp int8 blocks"),
        Precision("q4_0", "int4", "float32", "blocks of 32, fp16 scale", False, "GGUF Q4_0: llama.cpp int4 blocks"),
    )
}


def get_precision(name: str) -> Precision:
    try:
        return PRECISIONS[name]
    except KeyError:
        raise EdgexError(f"no such precision {name!r} (known: {', '.join(PRECISIONS)})") from None
