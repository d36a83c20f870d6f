"""Scheme vs lowering error for every quantized scheme edgex offers, or every default placement.

For each (model, component, format:precision): export on the tiny preset and gate the artifact as
`edgex export` does (`edgex.export.gate_files`: the same samples, references, gates and stored-tensor
checks), then print
the minimum SNR over outputs and samples of
    e2e       artifact vs fp32 eager
    scheme    the scheme reference (`Exporter.scheme_reference`) vs fp32 eager, policy gate
    lowering  artifact vs the scheme reference, lowering gate
with the lowest logits top-1 agreement (e2e and scheme), the flipped tokens / top-1s of each figure
that are not ties (`edgex.parity.gates.tie_db`), and each figure's verdict. The verdict is export's:
the run's, failed also by a stored tensor that fails its check (decided by `stored`).
Usage: python scripts/scheme_table.py [-m qwen3-tts] [-c talker_decode] [-s executorch:8da4w ...]
       [--defaults] [--skip-precision fp32 ...] [--skip executorch:code_predictor ...] [--json rows.json]
`--defaults` runs, per component, every FORMAT:PRECISION some target places by default for it
(`edgex.plan.plan` over every target), and records which targets place it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import traceback
from pathlib import Path

from edgex.export import gate_files
from edgex.exporters import EXPORTERS
from edgex.recipes import RECIPES
from edgex.errors import EdgexError
from edgex.parity.quantized import summary as quantized_summary
from edgex.plan import plan
from edgex.targets import TARGETS, get_target

SCHEMES = ["executorch:8da8w", "executorch:8da4w", "executorch:w8", "onnx:8da8w", "onnx:8da4w", "mnn:w8", "mnn:w4",
           "qnn:w8a16", "qnn:w8a8", "qnn:w4a16", "coreml:w8", "coreml:w4", "gguf:q8_0", "gguf:q4_0"]
OPTIONS = {"qnn": get_target("s25-htp").exporter_options["qnn"]}
MODELS = ["qwen3-tts", "spark-x2.5"]


def _flips(divergences: list) -> dict:
    """Flipped tokens / top-1s of one figure: how many, how many are not ties, and the worst margin
    as a multiple of its tie margin."""
    ratios = [float(d["margin"]) / float(d["tie_margin"]) if float(d["tie_margin"]) > 0 else float("inf") for d in divergences]
    return {"flips": len(divergences), "non_ties": sum(not d["tie"] for d in divergences),
            "worst_margin_over_tie": max(ratios) if ratios else None}


def measure(component, exporter_name: str, precision: str, tmp: Path, edit=None) -> dict:
    """One row; `edit(files)` changes the written files before they are gated (a planted bug)."""
    exporter = EXPORTERS.get(exporter_name)
    dest = tmp / f"{component.name}.{precision}{exporter.extension}"
    options = OPTIONS.get(exporter_name, {})
    start = time.perf_counter()
    result = exporter.export(component, precision, dest, **options)
    exported = time.perf_counter() - start
    if edit is not None:
        edit(result.files)
    gated = gate_files(component, exporter, result.files, result.io_float_dtype, precision, {}, None, options)
    report = gated["parity"]
    if report.method == "none":
        return {"error": f"parity none: {report.reason}"}
    figures = report.to_json()
    scheme, lowering = figures["scheme"] or {}, figures["lowering"] or {}
    stored = [line for line in (quantized_summary(gated.get("quantized_parity")), (gated.get("tensor_parity") or {}).get("failure")) if line]
    gate = figures["gate"]
    if stored and figures["verdict"] == "pass":  # the run passed: the stored bytes decided
        gate = {"figure": "stored"}
    return {"e2e": figures["min_snr_db"], "e2e_gate": figures["threshold_db"], "e2e_top1": figures["min_top1_agreement"],
            "e2e_flips": _flips(figures["divergences"]), "verdict": gated["verdict"], "run_verdict": figures["verdict"], "gate": gate,
            "stored_verdicts": {k: gated[k]["verdict"] for k in ("quantized_parity", "tensor_parity") if k in gated},
            "scheme": scheme.get("min_snr_db"), "scheme_gate": scheme.get("threshold_db"),
            "scheme_verdict": scheme.get("verdict"), "scheme_top1": scheme.get("min_top1_agreement"),
            "scheme_flips": _flips(scheme.get("divergences", [])),
            "lowering": lowering.get("min_snr_db"), "lowering_gate": lowering.get("threshold_db"),
            "lowering_verdict": lowering.get("verdict"), "lowering_flips": _flips(lowering.get("divergences", [])),
            "e2e_action_error": figures["max_action_error"], "scheme_action_error": scheme.get("max_action_error"),
            "lowering_action_error": lowering.get("max_action_error"),
            "reference": scheme.get("reference", "fp32 eager"), "failures": (stored + figures["failures"])[:3],
            "export_s": round(exported, 1), "seconds": round(time.perf_counter() - start, 1)}


def default_schemes(model: str) -> dict[str, dict[str, list[str]]]:
    """component -> "exporter:precision" -> the targets that place it by default for `model`."""
    facts = RECIPES.facts(model)
    placed: dict[str, dict[str, list[str]]] = {}
    for target in TARGETS.values():
        try:
            jobs = plan(facts, target, None, None, None)
        except EdgexError:  # the target places none of the model's components
            continue
        for job in jobs:
            placed.setdefault(job.component, {}).setdefault(f"{job.exporter}:{job.precision}", []).append(target.name)
    return placed


def _db(value) -> str:
    return f"{float(value):7.1f}" if value is not None else "      -"


def _top1(value) -> str:
    return f"{value:.2f}" if value is not None else "-"


def _non_ties(row: dict) -> str:
    """Non-tie flips e2e / scheme / lowering (flips in all)."""
    parts = [row[f"{k}_flips"] for k in ("e2e", "scheme", "lowering")]
    return "/".join(f"{p['non_ties']}({p['flips']})" for p in parts)


def _gate(value) -> str:
    return f"{value:g}" if value is not None else "-"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-m", "--model", action="append")
    parser.add_argument("-c", "--component", action="append")
    parser.add_argument("-s", "--scheme", action="append", help="FORMAT:PRECISION (with --defaults: only these of them)")
    parser.add_argument("--defaults", action="store_true",
                        help="every FORMAT:PRECISION some target places by default for the component")
    parser.add_argument("--skip-precision", action="append", default=[], help="precisions not run (e.g. fp32)")
    parser.add_argument("--skip", action="append", default=[], help="FORMAT:COMPONENT pairs not run (say why in the notes)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    print(f"{'model/component':32} {'format:precision':18} {'e2e':>7} {'scheme':>7} {'lowering':>8} {'top1 e2e/scheme':>15}  "
          f"non-tie(flips) e2e/scheme/lowering  verdict e2e,scheme/lowering (gates)  reference", flush=True)
    for model in args.model or MODELS:
        recipe = RECIPES.get(model)
        names = [n for n in recipe.facts.components if not args.component or n in args.component]
        placed = default_schemes(model) if args.defaults else {}
        if args.defaults:
            names = [n for n in names if n in placed]
        if not names:
            continue
        for component in recipe.components(recipe.load("tiny", None, 0), names):
            schemes = list(placed[component.name]) if args.defaults else SCHEMES
            schemes = [s for s in schemes if (not args.scheme or not args.defaults or s in args.scheme)
                       and s.split(":")[1] not in args.skip_precision]
            if not args.defaults and args.scheme:
                schemes = args.scheme
            for item in schemes:
                exporter, precision = item.split(":")
                label = f"{model}/{component.name}"
                if f"{exporter}:{component.name}" in args.skip:
                    print(f"{label:32} {item:18} skipped", flush=True)
                    continue
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        row = measure(component, exporter, precision, Path(tmp))
                    except Exception as exc:  # noqa: BLE001 - a table row, not a crash
                        traceback.print_exc()
                        row = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]}
                targets = placed.get(component.name, {}).get(item, [])
                rows.append({"model": model, "component": component.name, "format_precision": item, "targets": targets, **row})
                if args.json:  # after every row: a long run cut short keeps what it measured
                    args.json.write_text(json.dumps(rows, indent=1, default=str))
                if "error" in row:
                    print(f"{label:32} {item:18} error: {row['error']}", flush=True)
                    continue
                print(f"{label:32} {item:18} {_db(row['e2e'])} {_db(row['scheme'])} {_db(row['lowering']):>8} "
                      f"{_top1(row['e2e_top1']):>7}/{_top1(row['scheme_top1']):<7}  {_non_ties(row):>20}  "
                      f"{row['verdict']},{row['scheme_verdict'] or '-'}/{row['lowering_verdict'] or '-'}"
                      f" ({_gate(row['e2e_gate'])}/{_gate(row['lowering_gate'])})  {row['reference']} ({row['seconds']} s)",
                      flush=True)
                if row["failures"]:
                    print(f"{'':32}   {row['failures'][0][:160]}", flush=True)


if __name__ == "__main__":
    main()
