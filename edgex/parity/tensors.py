"""Tensor parity: tensors a written file stores, read back from the file and scored against the
eager weights they stand for.

Model parity covers only the weights its runs read. A graph's gather tables (token and codec
embeddings) are read a few rows per sample: a Spark-X2.5 decode call reads 1 row of 131072, and a
GGUF talker fed input embeddings never reads its token table at all; QNN's `.dlc` is run by nothing
here. Scoring what the file stores, at export and again in `edgex verify`, covers what no run reads.
Tables are scored row by row (a token reads one row: one corrupted row among 131072 moves a
whole-table SNR by under 0.001 dB) and every other tensor whole. The gate is the artifact's own: no
stored row or tensor may score below the dB its outputs must reach. Where a format cannot be read
back here (QNN's HTP context binary), the tables' rows are unverified, and so is the artifact.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..component import Component
from . import metrics
from .stored import StoredTensor


def row_snr_db(original: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """SNR in dB of each row (first axis) of `stored` against `original`, float64; inf where a row
    is exact, -inf where a row of zeros came back non-zero or where either row holds a NaN / inf
    (never NaN, which no gate comparison would count). Scored in blocks of rows (`metrics.in_row_blocks`)."""
    original = np.asarray(original).reshape(original.shape[0], -1)
    return metrics.in_row_blocks(_row_snr_db, original, np.asarray(stored).reshape(original.shape))


def _row_snr_db(original: np.ndarray, stored: np.ndarray) -> np.ndarray:
    ref = np.asarray(original, np.float64)
    out = np.asarray(stored, np.float64)
    err = ref - out
    signal, noise = (ref * ref).sum(1), (err * err).sum(1)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        snr = 10 * np.log10(signal / noise)
    snr[noise == 0] = math.inf
    snr[~(np.isfinite(ref).all(1) & np.isfinite(out).all(1))] = -math.inf
    return snr


def _closeness(table: np.ndarray, candidate: np.ndarray) -> float:
    """How close a stored constant is to a table, for finding the one that stores it: SNR with
    NaN / inf counted as zeros, so a table with a corrupted row is still found (and then fails)."""
    return metrics.snr_db(table, np.nan_to_num(candidate, nan=0.0, posinf=0.0, neginf=0.0))


# Rows of a table the first, cheap comparison reads, and how far below the closest candidate on them
# another candidate may be and still be compared whole.
_SAMPLED_ROWS, _SAMPLED_MARGIN_DB = 64, 6.0


def _likeliest(table: np.ndarray, candidates: list) -> list:
    """The candidates worth comparing whole: those within a margin of the closest on a strided
    sample of rows. A file may hold dozens of constants of a table's shape (a predictor's 15
    codebooks and 15 heads, each [2048, 1024]); comparing every one whole with every table was most
    of a job's stored-tensor check. The pairing itself is still decided on whole tables."""
    if len(candidates) < 2:
        return candidates
    step = max(1, table.shape[0] // _SAMPLED_ROWS)
    sampled = [_closeness(table[::step], c[::step]) for _, c in candidates]
    top = max(sampled)
    return [kc for kc, db in zip(candidates, sampled) if db >= top - _SAMPLED_MARGIN_DB or db == top]


def may_hold_table(shape, tables: dict) -> bool:
    """Whether a constant of `shape` can be one of the `tables` (name -> array or tensor) as
    `tables_read_back` looks for them: as stored, transposed, or a stack read as rows. A reader
    decodes only such constants: a file's weights are gigabytes that no table search needs."""
    shape = tuple(int(d) for d in shape)
    forms = {shape} | ({shape[::-1]} if len(shape) == 2 else set())
    if len(shape) > 2:
        forms.add((math.prod(shape[:-1]), shape[-1]))
    return any(tuple(t.shape) in forms for t in tables.values())


def tables_read_back(tables: dict[str, np.ndarray], constants: dict[str, np.ndarray] | None, why: str) -> dict[str, StoredTensor]:
    """Each gather table paired with the constant of the file that stores it: among the constants
    of its shape (or its transpose, or a stack of tables whose rows it is), the one closest to it. Names are not matched: converters rename
    and deduplicate constants, and a table must be found whatever they call it. A table no
    constant holds is reported missing; `constants` None (the format cannot be read back here, `why`)
    leaves every table unverified."""
    found = {}
    for name, table in tables.items():
        table = np.asarray(table, np.float32)
        if constants is None:
            found[name] = StoredTensor(f"unverified: {why}", None, table, rows=True, readable=False)
            continue
        candidates = []
        for key, array in constants.items():
            # as stored, transposed, or a stack of tables (a [heads, rows, width] constant read as rows)
            stacked = array.reshape(-1, array.shape[-1]) if array.ndim > 2 else None
            candidates += [(key, c) for c in (array, array.T if array.ndim == 2 else None, stacked)
                           if c is not None and c.shape == table.shape]
        best, best_db, where = None, -math.inf, ""
        for key, candidate in _likeliest(table, candidates):
            db = _closeness(table, candidate)
            if best is None or db > best_db:
                best, best_db, where = candidate, db, key
        found[name] = StoredTensor(f"table, stored as {where!r}" if best is not None else "table", best, table, rows=True)
    return found


def tensor_parity(exporter, component: Component, files: list[Path], threshold_db: float, precision: str,
                  options: dict | None = None) -> dict | None:
    """The manifest's `tensor_parity` block, or None for files whose weights their parity run covers."""
    stored = exporter.stored_tensors(component, files, precision, **(options or {}))
    if stored is None:
        return None
    tensors, unverified, why = {}, [], None
    for name, t in stored.items():  # one at a time: `stored` may read each tensor on demand (`ReadOnDemand`)
        if not t.readable:
            unverified.append(name)
            why = why or t.type
            tensors[name] = {"type": t.type, "rows": int(t.original.shape[0]), "snr_db": None}
        elif t.stored is None or t.original is None:
            problem = "missing from the file" if t.stored is None else "not a weight of the component"
            tensors[name] = {"type": t.type, "error": problem, "snr_db": -math.inf}
        elif t.stored.shape != t.original.shape:
            tensors[name] = {"type": t.type, "error": f"shape {list(t.stored.shape)} != {list(t.original.shape)}", "snr_db": -math.inf}
        elif t.rows:
            rows = row_snr_db(t.original, t.stored)
            worst = int(np.argmin(rows))
            tensors[name] = {"type": t.type, "shape": list(t.original.shape), "snr_db": float(rows[worst]), "scored": "per row",
                             "worst_row": worst, "rows_below_gate": int((~(rows >= threshold_db)).sum())}
        else:
            tensors[name] = {"type": t.type, "shape": list(t.original.shape), "snr_db": metrics.snr_db(t.original, t.stored)}
        if t.readable and t.stored is not None and t.original is not None and t.stored.shape == t.original.shape:
            for key, array in (("nonfinite", t.stored), ("original_nonfinite", t.original)):
                if count := metrics.nonfinite_count(array):
                    tensors[name][key] = count
    lowest = metrics.lowest(s["snr_db"] for s in tensors.values() if s["snr_db"] is not None)
    verdict = "fail" if lowest is not None and not lowest >= threshold_db else "unverified" if unverified else "pass"
    block = {"threshold_db": threshold_db, "min_snr_db": lowest, "verdict": verdict, "tensors": tensors}
    if verdict == "fail":
        block["failure"] = _failure(tensors, threshold_db)
    if unverified:
        block["unverified"] = f"{', '.join(unverified)} not read back ({why.removeprefix('unverified: ')})"
    return block


def _failure(tensors: dict, threshold_db: float) -> str:
    """One line: the worst stored tensor (and row) and why it fails."""
    name = min(tensors, key=lambda n: math.inf if tensors[n]["snr_db"] is None else tensors[n]["snr_db"])
    t = tensors[name]
    where = f"stored tensor {name}" + (f" (row {t['worst_row']})" if "worst_row" in t else "")
    if "error" in t:
        return f"{where}: {t['error']}"
    if t.get("nonfinite"):
        return f"{where} holds NaN / inf ({t['nonfinite']} value(s) in the tensor)"
    if t.get("original_nonfinite"):
        return f"{where}: the eager tensor it stands for holds NaN / inf ({t['original_nonfinite']} value(s))"
    return f"{where} {t['snr_db']:.1f} dB below the {threshold_db:.1f} dB gate"
