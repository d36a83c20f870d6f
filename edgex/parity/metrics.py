"""Parity metrics, computed in float64 over whole tensors (docs/parity.md).

A NaN or inf in either tensor makes every dB figure -inf: a non-finite value is a failure, and a
NaN figure would compare False against any gate and fall out of (or, depending on order, win)
Python's `min`. `lowest` is the one minimum over figures that parity takes.
"""

from __future__ import annotations

import math

import numpy as np


def finite(*arrays: np.ndarray) -> bool:
    return all(bool(np.all(np.isfinite(np.asarray(a, np.float64)))) for a in arrays)


def nonfinite_count(array: np.ndarray) -> int:
    array = np.asarray(array)
    return int(array.size - np.count_nonzero(np.isfinite(array))) if np.issubdtype(array.dtype, np.floating) else 0


def lowest(figures) -> float | None:
    """The minimum of dB figures, None for none; a NaN among them is -inf (a failure), never
    dropped or picked by position as Python's `min` does."""
    values = [-math.inf if math.isnan(f) else f for f in figures]
    return min(values) if values else None


def snr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """10*log10(sum(ref^2) / sum((ref-out)^2)); identical -> inf; NaN / inf in either -> -inf."""
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    if not finite(ref, out):
        return -math.inf
    noise = float(np.sum((ref - out) ** 2))
    signal = float(np.sum(ref**2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def psnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """20*log10(max|ref| / rmse), AI Hub's definition."""
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    if not finite(ref, out):
        return -math.inf
    rmse = math.sqrt(float(np.mean((ref - out) ** 2)))
    if rmse == 0.0:
        return math.inf
    peak = float(np.max(np.abs(ref)))
    return -math.inf if peak == 0.0 else 20.0 * math.log10(peak / rmse)


def cosine(ref: np.ndarray, out: np.ndarray) -> float:
    a, b = np.asarray(ref, np.float64).ravel(), np.asarray(out, np.float64).ravel()
    if not finite(a, b):
        return float("nan")  # no angle: reported, never gated
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def top1_agreement(ref: np.ndarray, out: np.ndarray) -> float:
    """Fraction of positions whose argmax over the last axis agrees."""
    return float(np.mean(np.argmax(ref, axis=-1) == np.argmax(out, axis=-1)))


def token_agreement(ref: np.ndarray, out: np.ndarray) -> float:
    return float(np.mean(np.asarray(ref) == np.asarray(out)))
