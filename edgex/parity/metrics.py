"""Parity metrics, computed in float64 over whole tensors (docs/parity.md)."""

from __future__ import annotations

import math

import numpy as np


def snr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """10*log10(sum(ref^2) / sum((ref-out)^2)); identical -> inf; NaN anywhere -> -inf."""
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    if not np.all(np.isfinite(out)):
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
    if not np.all(np.isfinite(out)):
        return -math.inf
    rmse = math.sqrt(float(np.mean((ref - out) ** 2)))
    if rmse == 0.0:
        return math.inf
    peak = float(np.max(np.abs(ref)))
    return -math.inf if peak == 0.0 else 20.0 * math.log10(peak / rmse)


def cosine(ref: np.ndarray, out: np.ndarray) -> float:
    a, b = np.asarray(ref, np.float64).ravel(), np.asarray(out, np.float64).ravel()
    if not np.all(np.isfinite(b)):
        return float("nan")
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a, b) / (na * nb))


def top1_agreement(ref: np.ndarray, out: np.ndarray) -> float:
    """Fraction of positions whose argmax over the last axis agrees."""
    return float(np.mean(np.argmax(ref, axis=-1) == np.argmax(out, axis=-1)))


def token_agreement(ref: np.ndarray, out: np.ndarray) -> float:
    return float(np.mean(np.asarray(ref) == np.asarray(out)))
