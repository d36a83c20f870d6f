"""Scheme vs lowering error for every quantized scheme edgex offers.

For each (model, component, format:precision): export on the tiny preset and gate the artifact as
`edgex export` does (`edgex.export.run_parity`: the same samples, references and gates), then print
the minimum SNR over outputs and samples of
    e2e       artifact vs fp32 eager
    scheme    the scheme reference (`Exporter.scheme_reference`) vs fp32 eager, policy gate
    lowering  artifact vs the scheme reference, lowering gate
with the lowest logits top-1 agreement (e2e and scheme), and each figure's verdict.
Usage: python scripts/scheme_table.py [-m qwen3-tts] [-c talker_decode] [-s executorch:8da4w ...]
       [--skip executorch:code_predictor ...] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from edgex.export import run_parity
from edgex.exporters import EXPORTERS
from edgex.recipes import RECIPES
from edgex.targets import get_target

SCHEMES = ["executorch:8da8w", "executorch:8da4w", "executorch:w8", "onnx:8da8w", "onnx:8da4w", "mnn:w8", "mnn:w4",
           "qnn:w8a16", "qnn:w8a8", "qnn:w4a16", "coreml:w8", "coreml:w4", "gguf:q8_0", "gguf:q4_0"]
OPTIONS = {"qnn": get_target("s25-htp").exporter_options["qnn"]}
MODELS = ["qwen3-tts", "spark-x2.5"]


def measure(component, exporter_name: str, precision: str, tmp: Path) -> dict:
    exporter = EXPORTERS.get(exporter_name)
    dest = tmp / f"{component.name}.{precision}{exporter.extension}"
    options = OPTIONS.get(exporter_name, {})
    start = time.perf_counter()
    result = exporter.export(component, precision, dest, **options)
    exported = time.perf_counter() - start
    report = run_parity(component, exporter, result.files, result.io_float_dtype, precision, {}, None, options)
    if report.method == "none":
        return {"error": f"parity none: {report.reason}"}
    figures = report.to_json()
    return {"e2e": figures["min_snr_db"], "e2e_top1": figures["min_top1_agreement"],
            "scheme": figures["scheme"]["min_snr_db"], "scheme_gate": figures["scheme"]["threshold_db"],
            "scheme_verdict": figures["scheme"]["verdict"], "scheme_top1": figures["scheme"]["min_top1_agreement"],
            "lowering": figures["lowering"]["min_snr_db"], "lowering_gate": figures["lowering"]["threshold_db"],
            "lowering_verdict": figures["lowering"]["verdict"], "reference": figures["scheme"]["reference"],
            "failures": figures["failures"][:3], "export_s": round(exported, 1),
            "seconds": round(time.perf_counter() - start, 1)}


def _db(value) -> str:
    return f"{float(value):7.1f}" if value is not None else "      -"


def _top1(value) -> str:
    return f"{value:.2f}" if value is not None else "-"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", "--model", action="append")
    parser.add_argument("-c", "--component", action="append")
    parser.add_argument("-s", "--scheme", action="append")
    parser.add_argument("--skip", action="append", default=[], help="FORMAT:COMPONENT pairs not run (say why in the notes)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    print(f"{'component':22} {'format:precision':18} {'e2e':>7} {'scheme':>7} {'lowering':>8} {'top1 e2e/scheme':>15}  "
          f"verdicts (scheme/lowering gate)  reference", flush=True)
    for model in args.model or MODELS:
        recipe = RECIPES.get(model)
        names = [n for n in recipe.facts.components if not args.component or n in args.component]
        if not names:
            continue
        for component in recipe.components(recipe.load("tiny", None, 0), names):
            for item in args.scheme or SCHEMES:
                exporter, precision = item.split(":")
                label = f"{model}/{component.name}"
                if f"{exporter}:{component.name}" in args.skip:
                    print(f"{label:32} {item:18} skipped", flush=True)
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        row = measure(component, exporter, precision, Path(tmp))
                    except Exception as exc:  # noqa: BLE001 - a table row, not a crash
                        row = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]}
                rows.append({"model": model, "component": component.name, "format_precision": item, **row})
                if args.json:  # after every row: a long run cut short keeps what it measured
                    args.json.write_text(json.dumps(rows, indent=1, default=str))
                if "error" in row:
                    print(f"{label:32} {item:18} error: {row['error']}", flush=True)
                    continue
                print(f"{label:32} {item:18} {_db(row['e2e'])} {_db(row['scheme'])} {_db(row['lowering']):>8} "
                      f"{_top1(row['e2e_top1']):>7}/{_top1(row['scheme_top1']):<7}  {row['scheme_verdict']}/{row['lowering_verdict']}"
                      f" ({row['scheme_gate']:g}/{row['lowering_gate']:g})  {row['reference']} ({row['seconds']} s)", flush=True)


if __name__ == "__main__":
    main()
