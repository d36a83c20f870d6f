"""The docs' tables of default placements, rendered from what the benchmarks measured.

    PYTHONPATH=. python scripts/doc_tables.py ROWS.json [MORE.json ...] [--write]

ROWS are the `--json` files of `scripts/scheme_table.py --defaults` and
`benchmarks/bench_planted_graph.py` (several chunks of one run assemble into one table; a faithful
row of the planted-graph matrix is the same measurement as a scheme-table row). Three tables:

- `defaults` (docs/precisions.md): per target and role, the FORMAT:PRECISION placed by default
  (`edgex.plan.plan`, no measurement);
- `planted-defaults` (docs/precisions.md): per default placement of a component the matrix covers,
  the faithful row's verdict and figures beside each planted bug's: the criterion separating them;
- `scheme-defaults` (docs/parity.md): end-to-end / scheme / lowering / task figures of every
  measured default placement, with the gates and the gate that decided.

Each is printed; with `--write` it replaces the lines between `<!-- table: NAME -->` and
`<!-- end table: NAME -->` of its file, so the tables in docs/ are the output of a run anyone can
repeat, never typed in. A default placement no row measured is listed as not run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_rows(paths: list[Path]) -> list[dict]:
    """Rows of several runs' JSON files (chunks of one table), the last run of a row winning."""
    rows: dict[tuple, dict] = {}
    for path in paths:
        for row in json.loads(Path(path).read_text()):
            key = (row.get("bug"), row["model"], row["component"], row["format_precision"])
            if key not in rows or "error" not in row:
                rows[key] = row
    return list(rows.values())


def db(value) -> str:
    if value is None:
        return "-"
    value = float(value)
    return "inf" if math.isinf(value) and value > 0 else f"{value:.1f}"


def _gate(value) -> str:
    return f" ({float(value):g})" if value is not None else ""


def task(row: dict, prefix: str = "e2e") -> str:
    """The task figure of a row: action error, or the lowest top-1 agreement and the flips that
    are not ties (e2e / scheme / lowering)."""
    parts = []
    if row.get(f"{prefix}_action_error") is not None:
        parts.append(f"action error {float(row[f'{prefix}_action_error']):.3f}")
    if row.get(f"{prefix}_top1") is not None:
        parts.append(f"top-1 {float(row[f'{prefix}_top1']):.2f}")
    flips = [row.get(f"{k}_flips") or {} for k in ("e2e", "scheme", "lowering")]
    if any(f.get("flips") for f in flips):
        parts.append("non-tie flips " + "/".join(str(f.get("non_ties", 0)) for f in flips))
    return ", ".join(parts) or "-"


def scheme_table(rows: list[dict]) -> str:
    """One line per (model, component, format:precision): the targets placing it, the three SNR
    figures with their gates, the task figure, export's verdict and the gate that decided it."""
    lines = ["| model | component | format: precision | placed by | e2e dB (gate) | scheme dB | lowering dB (gate) | task figure | verdict (decided by) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in sorted(rows, key=lambda r: (r["model"], r["component"], r["format_precision"])):
        head = f"| {row['model']} | {row['component']} | {row['format_precision']} | {', '.join(row.get('targets', [])) or '-'} |"
        if "error" in row:
            lines.append(f"{head} {row['error'][:90]} | | | | |")
            continue
        decided = (row.get("gate") or {}).get("figure", "-")
        lines.append(f"{head} {db(row['e2e'])}{_gate(row['e2e_gate'])} | {db(row['scheme'])} | "
                     f"{db(row['lowering'])}{_gate(row['lowering_gate'])} | {task(row)} | {row['verdict']} ({decided}) |")
    return "\n".join(lines)


def planted_table(rows: list[dict], placed: dict[tuple, list[str]] | None = None) -> str:
    """Per (model, component, format:precision) placed by default: the faithful row's verdict and
    figures beside each planted bug's. `placed`: (model, component, format:precision) -> targets."""
    cells: dict[tuple, dict[str, dict]] = {}
    for row in rows:
        cells.setdefault((row["model"], row["component"], row["format_precision"]), {})[row["bug"]] = row
    lines = ["| model | component | format: precision | placed by | faithful: verdict, e2e / lowering dB (task) | planted: verdict (decided by), e2e / lowering dB (task) |",
             "|---|---|---|---|---|---|"]

    def cell(row: dict) -> str:
        if "error" in row:
            return row["error"][:80]
        decided = (row.get("gate") or {}).get("figure", "-")
        figure = task(row)
        return f"{row['verdict']} ({decided}), {db(row['e2e'])} / {db(row['lowering'])}" + (f" ({figure})" if figure != "-" else "")

    for key in sorted(cells):
        bugs = cells[key]
        faithful = bugs.get("faithful")
        planted = "; ".join(f"{bug}: {cell(row)}" for bug, row in sorted(bugs.items()) if bug != "faithful")
        targets = ", ".join((placed or {}).get(key, [])) or "-"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {targets} | {cell(faithful) if faithful else 'not run'} | {planted or 'not run'} |")
    return "\n".join(lines)


def write_section(path: Path, name: str, text: str) -> None:
    """Replace the lines between `<!-- table: NAME -->` and `<!-- end table: NAME -->` in `path`
    with `text`, written to a temporary file and renamed into place."""
    begin, end = f"<!-- table: {name} -->", f"<!-- end table: {name} -->"
    content = path.read_text(encoding="utf-8")
    if begin not in content or end not in content:
        raise SystemExit(f"{path}: no section {name!r} (add the lines {begin} and {end})")
    head, rest = content.split(begin, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{begin}\n{text}\n{end}{tail}"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(new)
    os.replace(tmp, path)


def defaults_table() -> str:
    """Per target and role: the FORMAT:PRECISION each places by default, and for which models."""
    from edgex.recipes import RECIPES
    from edgex.targets import TARGETS
    from scheme_table import default_schemes

    placed: dict[tuple[str, str], dict[str, set[str]]] = {}
    for model in RECIPES.names():
        roles = RECIPES.facts(model).components
        for component, schemes in default_schemes(model).items():
            for scheme, targets in schemes.items():
                for target in targets:
                    placed.setdefault((target, roles[component]), {}).setdefault(scheme, set()).add(model)
    lines = ["| target | role | format: precision (models) |", "|---|---|---|"]
    for target, role in sorted(placed, key=lambda k: (list(TARGETS).index(k[0]), k[1])):
        schemes = placed[(target, role)]
        lines.append(f"| {target} | {role} | " + "; ".join(f"{s} ({', '.join(sorted(schemes[s]))})" for s in sorted(schemes)) + " |")
    return "\n".join(lines)


def _placed_and_measured(rows: list[dict]) -> tuple[dict, list[dict]]:
    from scheme_table import default_schemes

    placed = {}
    for model in sorted({r["model"] for r in rows}):
        for component, schemes in default_schemes(model).items():
            for scheme, targets in schemes.items():
                placed[(model, component, scheme)] = targets
    faithful = [r for r in rows if r.get("bug", "faithful") == "faithful"]
    for row in faithful:
        row.setdefault("targets", placed.get((row["model"], row["component"], row["format_precision"]), []))
    return placed, faithful


def all_placed() -> dict[tuple[str, str, str], list[str]]:
    """(model, component, FORMAT:PRECISION) -> the targets placing it by default, every model."""
    from edgex.recipes import RECIPES
    from scheme_table import default_schemes

    return {(model, component, scheme): targets for model in RECIPES.names()
            for component, schemes in default_schemes(model).items() for scheme, targets in schemes.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", type=Path, nargs="*", help="--json files of scheme_table.py / bench_planted_graph.py")
    parser.add_argument("--write", action="store_true", help="write the tables into docs/precisions.md and docs/parity.md")
    args = parser.parse_args()
    rows = load_rows(args.rows)
    placed, faithful = _placed_and_measured(rows)
    planted = [r for r in rows if "bug" in r]
    tables = {("precisions.md", "defaults"): defaults_table(),
              ("precisions.md", "planted-defaults"): planted_table([r for r in planted if (r["model"], r["component"], r["format_precision"]) in placed], placed),
              ("parity.md", "scheme-defaults"): scheme_table([r for r in faithful if (r["model"], r["component"], r["format_precision"]) in placed])}
    measured = {(r["model"], r["component"], r["format_precision"]) for r in faithful}
    missing: dict[tuple[str, str], list[str]] = {}
    for model, component, scheme in sorted(set(all_placed()) - measured):
        missing.setdefault((model, component), []).append(scheme)
    not_run = "; ".join(f"{m} {c} ({', '.join(s)})" for (m, c), s in missing.items())
    tables[("parity.md", "scheme-defaults")] += (
        f"\n\n{len(measured & set(all_placed()))} of {len(all_placed())} default placements measured"
        + (f". Not run: {not_run}." if not_run else "."))
    for (doc, name), text in tables.items():
        print(f"## {doc}: {name}\n{text}\n")
        if args.write:
            write_section(ROOT / "docs" / doc, name, text)


if __name__ == "__main__":
    main()
