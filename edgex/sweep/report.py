"""The sweep's outputs: a table per component, JSON, CSV, the Pareto front, and the recommendation
(`recommend.py`) as a placement file that `edgex export --placement @FILE` and `edgex pipeline
--placement @FILE` read."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from ..artifacts.files import strict_json, write_bytes_atomic, write_json_atomic
from ..status import COARSE_PASS, passed
from .recommend import candidate

COLUMNS = ("component", "format", "precision", "calibration", "min_snr_db", "gate_db", "scheme_db", "scheme_gate_db",
           "lowering_db", "lowering_gate_db", "verdict", "coarse_scheme", "bytes", "export_s", "reused", "latency_ms",
           "latency_note")
PLACEMENT_FILE = "recommended.placement"


def _number(value) -> float | None:
    """Figures as strict JSON stores them ("inf") back to floats; None stays None."""
    return None if value is None else float(value)


def pareto(rows: list[dict], allow_coarse: bool = False) -> list[dict]:
    """The candidate points (`recommend.candidate`: passing, coarse schemes only with `allow_coarse`)
    no other candidate beats on both size and dB (smaller and at least as good, or as small and
    better), smallest first: the only ones worth choosing between."""
    points = [r for r in rows if candidate(r, allow_coarse) and r["min_snr_db"] is not None]
    front = []
    for r in sorted(points, key=lambda r: (r["bytes"], -_number(r["min_snr_db"]))):
        if not front or _number(r["min_snr_db"]) > _number(front[-1]["min_snr_db"]):
            front.append(r)
    return front


def placement_line(row: dict) -> str:
    """`component=exporter:precision[:calibration]`, the calibration only where the sweep set it."""
    suffix = f":{row['calibration']}" if row["explicit_calibration"] else ""
    return f"{row['component']}={row['exporter']}:{row['precision']}{suffix}"


def placement_text(model: str, target: str, recommendation: dict) -> str:
    """The placement lines, headed by what they were chosen for: the objective per component, the
    floor (each point passed its own gate) and the in-situ verdict with the placements tried."""
    chosen, situ = recommendation["chosen"], recommendation["in_situ"]
    lines = [f"# edgex sweep {model} --target {target}",
             "# objective per component (best first): " + ", ".join(f"{c} {o}" for c, o in recommendation["objective"].items()),
             "# floor: every point below passed its own gate (dB vs fp32 eager; scheme and lowering gates where quantized)"
             + ("; schemes declared too coarse admitted (--allow-coarse)" if recommendation.get("allow_coarse") else
                "; no scheme its recipe declares too coarse (--allow-coarse admits them)")]
    lines += [f"# left out: {item['point']} ({item['reason']})" for item in recommendation.get("left_out", [])]
    if passed(situ["verdict"]):
        lines.append(f"# in situ: {situ['verdict']} (edgex pipeline), placement {len(situ['tried'])} of at most {situ['bound']} "
                     "tried in objective order")
    elif situ["verdict"] == "fail":
        lines.append(f"# in situ: {situ['reason']} (at most {situ['bound']}); no pipeline placement is recommended")
        lines += [f"#   tried {' '.join(t['placement'])}: {t['verdict']} ({(t['failures'] or ['-'])[0]})" for t in situ["tried"]]
    else:
        lines.append(f"# in situ: not run ({situ['reason']})")
    lines.append(f"# use: edgex export {model} --target {target} --placement @{PLACEMENT_FILE}")
    for component, row in chosen.items():
        if row is None:
            lines.append(f"# {component}: nothing recommended; the target's default placement applies")
        else:
            lines.append(f"{placement_line(row)}  # {_cell(row['min_snr_db'])} dB >= gate {_cell(row['gate_db'])} dB, "
                         f"{row['bytes']} bytes" + (f", {_cell(row['latency_ms'])} ms" if row.get("latency_ms") is not None else "")
                         + (f", {COARSE_PASS}: {row.get('coarse_scheme')}" if row["verdict"] == COARSE_PASS else ""))
    return "\n".join(lines) + "\n"


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, float)) or value in ("inf", "-inf", "nan"):
        number = float(value)
        return str(value) if math.isinf(number) or math.isnan(number) else (f"{number:.1f}" if isinstance(value, float) else str(value))
    return str(value)


def markdown(rows: list[dict], chosen: dict[str, dict | None], left: list[dict] | None = None) -> str:
    """One table per component; the recommended row marked, failed rows with their first reason;
    then the points left out of the choice, with why (a scheme declared too coarse: the recipe's
    reason)."""
    heads = ("scheme", "calibration", "dB vs fp32 (gate)", "scheme dB (gate)", "lowering dB (gate)", "verdict", "bytes",
             "export s", "latency ms")
    parts = []
    for component in dict.fromkeys(r["component"] for r in rows):
        parts += [f"### {component}", "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        for r in (r for r in rows if r["component"] == component):
            mark = " **recommended**" if chosen.get(component) is r else ""
            verdict = r["verdict"] + mark + (f" ({r['failures'][0]})" if not passed(r["verdict"]) and r["failures"] else "")
            pair = lambda a, b: "-" if r[a] is None else f"{_cell(r[a])} ({_cell(r[b])})"
            latency = _cell(r["latency_ms"]) if r["latency_ms"] is not None else f"- ({r['latency_note']})"
            parts.append("| " + " | ".join((f"{r['format']} {r['precision']}", _cell(r["calibration"]), pair("min_snr_db", "gate_db"),
                                            pair("scheme_db", "scheme_gate_db"), pair("lowering_db", "lowering_gate_db"),
                                            verdict, str(r["bytes"]), f"{r['export_s']:.1f}" + (" (reused)" if r["reused"] else ""),
                                            latency)) + " |")
        parts.append("")
    if left:
        parts += ["Left out of the recommendation:", ""] + [f"- {item['point']}: {item['reason']}" for item in left] + [""]
    return "\n".join(parts)


def write(out: Path, model: str, target: str, data: dict, plot, recommendation: dict) -> dict:
    """sweep.json, sweep.csv, sweep.md, recommended.placement and sweep.png into `out`;
    `recommendation` is `recommend.recommend`'s."""
    rows = data["rows"]
    chosen = recommendation["chosen"]
    allow_coarse = recommendation.get("allow_coarse", False)
    fronts = {c: [rows.index(r) for r in pareto([r for r in rows if r["component"] == c], allow_coarse)] for c in chosen}
    paths = {name: out / name for name in ("sweep.json", "sweep.csv", "sweep.md", PLACEMENT_FILE, "sweep.png")}
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(strict_json(rows))
    write_bytes_atomic(paths["sweep.csv"], buffer.getvalue().encode())
    write_bytes_atomic(paths["sweep.md"], markdown(rows, chosen, recommendation.get("left_out")).encode())
    write_bytes_atomic(paths[PLACEMENT_FILE], placement_text(model, target, recommendation).encode())
    summary = {"model": model, "target": target, "status": data["status"], "seconds": data["build"]["seconds"],
               "reused": sum(1 for r in rows if r["reused"]), "rows": rows, "pareto": fronts,
               "recommendation": {c: (placement_line(r) if r else None) for c, r in chosen.items()},
               "objective": recommendation["objective"], "in_situ": recommendation["in_situ"],
               "allow_coarse": allow_coarse, "left_out": recommendation.get("left_out", []),
               "served_by": recommendation.get("served_by", {}),
               "files": {k: str(v) for k, v in paths.items()}}
    write_json_atomic(paths["sweep.json"], strict_json(summary))
    plot(paths["sweep.png"], f"edgex sweep {model} -> {target}", rows, fronts)  # last: the figures are on disk whatever happens
    return strict_json(summary)
