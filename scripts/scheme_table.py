"""Scheme vs lowering error for every quantized scheme edgex offers (issue 18, hole 4).

For each (component, exporter, precision): export, run the artifact on every parity sample, and
print the minimum SNR over outputs and samples of
    e2e       artifact vs fp32 eager (today's single figure)
    scheme    eager model with the file's weights / activation quantization vs fp32 eager
    lowering  artifact vs that scheme reference
Usage: python scripts/scheme_table.py [-c talker_decode -c code_predictor_step] [-s executorch:8da4w ...]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from edgex.component import TOKENS
from edgex.exporters import EXPORTERS
from edgex.parity import metrics
from edgex.parity.check import to_numpy
from edgex.parity.runtimes import RUNTIMES
from edgex.parity.scheme import build
from edgex.recipes import RECIPES
from edgex.targets import get_target

SCHEMES = ["executorch:8da8w", "executorch:8da4w", "executorch:w8", "mnn:w8", "mnn:w4", "qnn:w8a16", "qnn:w8a8",
           "qnn:w4a16", "coreml:w8", "coreml:w4", "gguf:f16", "gguf:q8_0", "gguf:q4_0"]
OPTIONS = {"qnn": get_target("s25-htp").exporter_options["qnn"]}


def min_snr(component, ref_outputs, outputs) -> float:
    snrs = [metrics.snr_db(np.asarray(r), np.asarray(o)) for spec, r, o in zip(component.outputs, ref_outputs, outputs)
            if spec.kind != TOKENS]
    return min(snrs)


def measure(component, exporter_name: str, precision: str, tmp: Path) -> dict:
    exporter = EXPORTERS.get(exporter_name)
    dest = tmp / f"{component.name}.{precision}{exporter.extension}"
    start = time.perf_counter()
    options = OPTIONS.get(exporter_name, {})
    result = exporter.export(component, precision, dest, **options)
    session = RUNTIMES.get(exporter.runtime).load(result.files, None)
    scheme = exporter.stored_scheme(component, precision, result.files, **options)
    reference = build(component, scheme)
    row = {"e2e": math.inf, "scheme": math.inf, "lowering": math.inf}
    for sample, inputs in component.samples.items():
        fp32 = [t.numpy() for t in component.reference_outputs(sample)]
        quantized = [t.numpy() for t in reference(inputs)]
        out = session.run(to_numpy(inputs, result.io_float_dtype))
        row["e2e"] = min(row["e2e"], min_snr(component, fp32, out))
        row["scheme"] = min(row["scheme"], min_snr(component, fp32, quantized))
        row["lowering"] = min(row["lowering"], min_snr(component, quantized, out))
    row |= {"source": scheme.source, "coverage": reference.coverage, "notes": scheme.notes,
            "activations": len(scheme.activations), "seconds": round(time.perf_counter() - start, 1)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-c", "--component", action="append")
    parser.add_argument("-s", "--scheme", action="append")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    recipe = RECIPES.get("qwen3-tts")
    loaded = recipe.load("tiny", None, 0)
    components = recipe.components(loaded, args.component or ["talker_decode", "code_predictor_step"])
    rows = []
    print(f"{'component':22} {'format:precision':18} {'e2e':>7} {'scheme':>7} {'lowering':>8}  source / unmatched")
    for component in components:
        for item in args.scheme or SCHEMES:
            exporter, precision = item.split(":")
            with tempfile.TemporaryDirectory() as tmp:
                try:
                    row = measure(component, exporter, precision, Path(tmp))
                except Exception as exc:  # noqa: BLE001 - a table row, not a crash
                    row = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]}
            rows.append({"component": component.name, "scheme": item, **row})
            if "error" in row:
                print(f"{component.name:22} {item:18} error: {row['error']}", flush=True)
            else:
                unmatched = "; ".join(f"{k}: {v}" for k, v in row["coverage"]["unmatched"].items())
                print(f"{component.name:22} {item:18} {row['e2e']:7.1f} {row['scheme']:7.1f} {row['lowering']:8.1f}  "
                      f"{row['source']} [{len(row['coverage']['parameters_swapped'])} params, {row['activations']} act]"
                      f"{' unmatched ' + unmatched if unmatched else ''} ({row['seconds']} s)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
