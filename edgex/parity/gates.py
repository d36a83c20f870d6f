"""Parity gates: the minimum SNR (dB) an artifact must reach, per (role, precision).

Defaults come from measurements on the tiny and 0.6b presets (README, "Parity gates"): fp32 graphs
differ from eager only by kernel rounding (> 100 dB measured), fp16 by half-precision rounding,
int schemes by quantization noise. Sampled-token outputs must agree exactly in fp32; in lower
precisions a near-tie may flip a code, so there the gate is the SNR of the logits over the
teacher-forced prefix, including the step that flipped (a flip with faithful logits is a tie-break;
a flip from broken logits fails on SNR). Agreement is always reported.
"""

from __future__ import annotations

from ..errors import EdgexError

DEFAULT_DB = {"fp32": 60.0, "fp16": 30.0, "8da8w": 15.0, "8da4w": 5.0, "w8": 20.0, "w4": 5.0,
              # GGUF (llama.cpp computes in fp32 on F16 / block-quantized weights, F16 KV cache)
              "f16": 30.0, "q8_0": 25.0, "q4_0": 8.0,
              # HTP static QDQ, calibrated. Measured in the simulator on tiny presets: w8a16 talker
              # 23 dB, Spark-X2.5 13-17 dB (the same QDQ graph on ONNX Runtime CPU: 13-16 dB, so
              # that is the scheme's noise on random weights, not an HTP error); broken graphs score
              # 0-5 dB (w4a16 talker 5 dB; docs/models.md: uncalibrated w4a16 -1.6 dB on a real model)
              "w8a16": 10.0, "w8a8": 8.0, "w4a16": 8.0}
ROLE_DB: dict[tuple[str, str], float] = {}
TOKEN_AGREEMENT = {"fp32": 1.0}  # other schemes: reported, gated through the prefix SNR


def parse_overrides(values: list[str] | None) -> dict[str, float]:
    """`--min-db 30` (every artifact) or `--min-db decoder=40` / `--min-db fp16=25` (role or precision)."""
    overrides: dict[str, float] = {}
    for value in values or []:
        key, _, number = value.rpartition("=")
        try:
            overrides[key or "*"] = float(number)
        except ValueError:
            raise EdgexError(f"bad --min-db {value!r}: expected DB, ROLE=DB or PRECISION=DB") from None
    return overrides


def threshold_db(role: str, precision: str, overrides: dict[str, float] | None = None) -> float:
    overrides = overrides or {}
    for key in (f"{role}:{precision}", role, precision, "*"):
        if key in overrides:
            return overrides[key]
    return ROLE_DB.get((role, precision), DEFAULT_DB.get(precision, 20.0))


def token_threshold(precision: str) -> float | None:
    return TOKEN_AGREEMENT.get(precision)
