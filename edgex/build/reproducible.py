"""Whether exporting the same job twice gives the same bytes, per exporter, as measured.

Measured by exporting one tiny component twice per format in separate processes and comparing
sha256 (`tests/test_build.py` re-measures onnx, gguf and qnn on every run: its shards re-export the
test matrix with empty caches, so this table cannot go stale for them silently). Each build
artifact carries its exporter's row as `build.reproducible`, labelled as declared (`basis`): a build
exports each artifact once and does not measure it; where a format is not deterministic,
a rebuild's new sha256 is expected and `edgex verify` (parity re-run) is the check that matters.
"""

from __future__ import annotations

# exporter -> (same sha256 on a rebuild?, what was measured / why not). Measured on a tiny speech
# model's talker decode graph (fp16; gguf f16), exported twice in separate `edgex build` runs with separate caches.
MEASURED: dict[str, tuple[bool, str]] = {
    "executorch": (True, "same .pte bytes on a rebuild of a talker decode graph; the unrolled 15-step predictor's "
                         ".pte has differed between two exports of one job (same parity figures)"),
    "onnx": (True, "same .onnx and .onnx.data bytes on a rebuild, from any checkout path (the exporter drops the "
                   "Python stack torch.onnx records on each node)"),
    "gguf": (True, "same .gguf bytes on a rebuild"),
    "mnn": (False, "MNN's converter writes a random UUID into every .mnn (25 bytes differ; the graph and weights agree)"),
    "qnn": (False, "ONNX Runtime's QNN EP names the compiled partition QNNExecutionProvider_..._<hash>_1_0 with a hash "
                   "that differs per export process; the name is inside the .qnn.onnx, the context binary and the .dlc, "
                   "and the .dlc also records its generation timestamp"),
    "coreml": (False, "the .mlpackage Manifest.json names its items by random UUIDs, and coremltools serializes the ML "
                      "program's protobuf maps (op attributes, metadata) in an order that changes between processes"),
}


BASIS = ("declared per format (edgex.build.reproducible: one tiny component exported twice when the table was "
         "written); not measured for this artifact")


def reproducibility(exporter: str) -> dict:
    """The format's row, labelled as a declaration (`basis`): a build does not export twice to measure it."""
    if exporter not in MEASURED:
        return {"deterministic": None, "why": "not measured for this format", "basis": BASIS}
    deterministic, why = MEASURED[exporter]
    return {"deterministic": deterministic, "why": why, "basis": BASIS}
