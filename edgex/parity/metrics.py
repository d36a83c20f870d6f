"""Parity metrics, computed in float64 over whole tensors, read a piece at a time (docs/parity.md).

A NaN or inf in either tensor makes every dB figure -inf: a non-finite value is a failure, and a
NaN figure would compare False against any gate and fall out of (or, depending on order, win)
Python's `min`. `lowest` is the one minimum over figures that parity takes.
"""

from __future__ import annotations

import math
import statistics

import numpy as np


# Elements per float64 temporary the whole-tensor figures make (16 MiB): a 0.6b model's 152k-row
# embedding table is ~1.2 GB a copy in float64, and a figure over it made five such copies at once.
CHUNK = 1 << 21


def chunks(*arrays: np.ndarray, size: int = CHUNK):
    """The arrays flattened and read `size` elements at a time, each piece in float64: sums over
    whole tensors without a float64 copy of any. One piece (the same sums as over the whole array)
    for a tensor of at most `size` elements."""
    arrays = [np.asarray(a) for a in arrays]
    if len({a.shape for a in arrays}) > 1:  # as the arithmetic on whole arrays broadcasts them
        arrays = np.broadcast_arrays(*arrays)
    flat = [a.reshape(-1) for a in arrays]
    for i in range(0, max(1, flat[0].size), size):
        yield tuple(np.asarray(f[i:i + size], np.float64) for f in flat)


def finite(*arrays: np.ndarray) -> bool:
    return all(bool(np.all(np.isfinite(piece))) for a in arrays for (piece,) in chunks(a))


def nonfinite_count(array: np.ndarray) -> int:
    array = np.asarray(array)
    return int(array.size - np.count_nonzero(np.isfinite(array))) if np.issubdtype(array.dtype, np.floating) else 0


def lowest(figures) -> float | None:
    """The minimum of dB figures, None for none; a NaN among them is -inf (a failure), never
    dropped or picked by position as Python's `min` does."""
    values = [-math.inf if math.isnan(f) else f for f in figures]
    return min(values) if values else None


def median(values) -> float | None:
    """The median of per-step figures or times, rounded to 3 places; None for none."""
    return round(statistics.median(values), 3) if values else None


def in_row_blocks(per_row, *arrays: np.ndarray, rows: int = 4096) -> np.ndarray:
    """`per_row(*blocks)` on `rows` rows of `arrays` (one first axis) at a time, its results joined:
    a figure per row of a large table without temporaries of the whole table (a 152k-row embedding
    in float64 or uint64 is gigabytes a copy). Exact for any per-row figure: a row's result does not
    depend on the rows beside it."""
    count = arrays[0].shape[0]
    return np.concatenate([per_row(*(a[i:i + rows] for a in arrays)) for i in range(0, max(1, count), rows)])


def snr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """10*log10(sum(ref^2) / sum((ref-out)^2)); identical -> inf; NaN / inf in either -> -inf."""
    if not finite(ref, out):
        return -math.inf
    noise = sum(float(np.sum((r - o) ** 2)) for r, o in chunks(ref, out))
    signal = sum(float(np.sum(r**2)) for (r,) in chunks(ref))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def psnr_db(ref: np.ndarray, out: np.ndarray) -> float:
    """20*log10(max|ref| / rmse), AI Hub's definition."""
    if not finite(ref, out):
        return -math.inf
    squares, count = 0.0, 0
    for r, o in chunks(ref, out):
        squares += float(np.sum((r - o) ** 2))
        count += r.size
    rmse = math.sqrt(squares / count) if count else math.nan
    if rmse == 0.0:
        return math.inf
    peak = max(float(np.max(np.abs(r), initial=0.0)) for (r,) in chunks(ref))
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


# Multi-resolution STFT of `spectral_db`: (n_fft, hop) pairs, periodic Hann windows. 2048 / 1024 / 512
# points at 24 kHz resolve 12 / 23 / 47 Hz in frequency and 21 / 11 / 5 ms in time.
SPECTRAL_RESOLUTIONS = ((2048, 512), (1024, 256), (512, 128))
# Log magnitudes are measured from a floor this far (dB) under the reference's loudest bin at each
# resolution: quieter bins count as the floor in both signals, so the figure does not depend on the
# signal's absolute level, nor on bins under any playback's noise.
SPECTRAL_RANGE_DB = 40.0


def _magnitudes(signal: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """|STFT| of `signal` [..., time] (periodic Hann, no centring, the tail zero-padded to a frame)."""
    length = signal.shape[-1]
    frames = 1 + max(0, -(-(length - n_fft) // hop))
    padded = np.zeros((*signal.shape[:-1], (frames - 1) * hop + n_fft))
    padded[..., :length] = signal
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    windows = np.lib.stride_tricks.sliding_window_view(padded, n_fft, axis=-1)[..., ::hop, :]
    return np.abs(np.fft.rfft(windows * window, axis=-1))


def spectral_db(ref: np.ndarray, out: np.ndarray, resolutions=SPECTRAL_RESOLUTIONS,
                range_db: float = SPECTRAL_RANGE_DB) -> float:
    """A phase-insensitive figure for waveforms [..., time], higher is better: the SNR of the
    log-magnitude spectrograms, summed over `resolutions`,
    10*log10(sum L_ref^2 / sum (L_ref - L_out)^2) with L = 20*log10(max(|S|, floor) / floor) and the
    floor `range_db` under the reference's loudest bin. A phase change leaves |S| nearly as it is;
    a wrong pitch, a missing band or noise does not. An error of 1 dB in every bin of a spectrogram
    lying 40 dB over its floor on average scores 32 dB. Identical -> inf; NaN / inf in either ->
    -inf. Deterministic: numpy's FFT on float64, nothing random."""
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    if not finite(ref, out):
        return -math.inf
    if np.array_equal(ref, out):
        return math.inf
    length = ref.shape[-1] if ref.ndim else 1
    ref, out = ref.reshape(-1, length), out.reshape(-1, length)
    sizes = sorted({(min(n, length), max(1, h * min(n, length) // n)) for n, h in resolutions}, reverse=True)
    signal = noise = 0.0
    for n_fft, hop in sizes:
        s_ref, s_out = _magnitudes(ref, n_fft, hop), _magnitudes(out, n_fft, hop)
        floor = float(np.max(s_ref)) * 10.0 ** (-range_db / 20.0) or np.finfo(np.float64).tiny
        l_ref = 20.0 * np.log10(np.maximum(s_ref, floor) / floor)
        l_out = 20.0 * np.log10(np.maximum(s_out, floor) / floor)
        signal += float(np.sum(l_ref**2))
        noise += float(np.sum((l_ref - l_out) ** 2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def action_error(ref: np.ndarray, out: np.ndarray, spread) -> np.ndarray:
    """Per action dimension (the last axis): the RMS error over every other axis (the steps of a
    chunk), in units of that dimension's spread in the policy's data (`spread`, its standard
    deviation in the policy's own units), lower is better. A gripper and a joint angle then count
    alike, whatever their units and ranges; an SNR over the whole chunk would weigh them by their
    magnitudes, and a large-valued dimension hides a small one. NaN / inf in either -> inf."""
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    spread = np.asarray(spread, np.float64).reshape(-1)
    dims = ref.shape[-1] if ref.ndim else 1
    if spread.size != dims:
        raise ValueError(f"action spread has {spread.size} dimension(s), the actions {dims}")
    if not finite(ref, out):
        return np.full(dims, math.inf)
    diff = (out - ref).reshape(-1, dims)
    return np.sqrt(np.mean(diff**2, axis=0)) / spread
