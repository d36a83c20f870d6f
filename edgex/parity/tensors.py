"""Tensor parity: every tensor a written file stores, read back from the file and scored against
the eager weight it stands for.

Model parity covers only the weights its runs read. A GGUF talker fed input embeddings never reads
its token embedding table (most of the file), so a corrupted table would pass; QNN's `.dlc` is run
by nothing here at all. Scoring every stored tensor at export, and again in `edgex verify`, covers
what no run reads. The gate is the artifact's
own: no stored weight may score below the dB its outputs must reach.
"""

from __future__ import annotations

import math
from pathlib import Path

from ..component import Component
from . import metrics


def tensor_parity(exporter, component: Component, files: list[Path], threshold_db: float, precision: str,
                  options: dict | None = None) -> dict | None:
    """The manifest's `tensor_parity` block, or None for files whose weights their parity run covers."""
    stored = exporter.stored_tensors(component, files, precision, **(options or {}))
    if stored is None:
        return None
    tensors = {}
    for name, t in stored.items():
        if t.stored is None or t.original is None:
            problem = "missing from the file" if t.stored is None else "not a weight of the component"
            tensors[name] = {"type": t.type, "error": problem, "snr_db": -math.inf}
        elif t.stored.shape != t.original.shape:
            tensors[name] = {"type": t.type, "error": f"shape {list(t.stored.shape)} != {list(t.original.shape)}", "snr_db": -math.inf}
        else:
            tensors[name] = {"type": t.type, "shape": list(t.original.shape), "snr_db": metrics.snr_db(t.original, t.stored)}
    snrs = [s["snr_db"] for s in tensors.values()]
    lowest = min(snrs) if snrs else None
    passed = lowest is None or lowest >= threshold_db
    return {"threshold_db": threshold_db, "min_snr_db": lowest, "verdict": "pass" if passed else "fail", "tensors": tensors}
