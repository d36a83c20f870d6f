"""The sweep's picture: per component, dB against fp32 eager over artifact size, every point shown.

Passing points are filled, those at a scheme the recipe declares too coarse (verdict "pass
(coarse)") hollow and labelled so, failed ones a red cross with the scheme named; the Pareto front
of the candidate points is a line; each precision's gate is a dashed line in its colour. matplotlib is
imported here only (the Agg backend: no display needed)."""

from __future__ import annotations

import math
import os
from pathlib import Path

from ..status import COARSE_PASS

COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")


def _db(value) -> float | None:
    return None if value is None else float(value)


def plot(path: Path, title: str, rows: list[dict], fronts: dict[str, list[int]]) -> None:
    try:
        import matplotlib
    except ImportError as exc:
        from ..errors import EdgexError

        raise EdgexError(f"the sweep's picture needs matplotlib ({exc}); the table, JSON, CSV and placement are written: "
                         f"install it (scripts/setup does) and run python -m edgex.sweep.plot {path.parent}") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    components = list(fronts)
    schemes = list(dict.fromkeys(f"{r['format']} {r['precision']}" for r in rows))
    colour = {s: COLOURS[i % len(COLOURS)] for i, s in enumerate(schemes)}
    columns = min(3, len(components))
    lines = -(-len(components) // columns)
    width = max(5.2 * columns, 8.0)
    fig, axes = plt.subplots(lines, columns, figsize=(width, 4.2 * lines + 0.8), squeeze=False)
    finite = [_db(r["min_snr_db"]) for r in rows if _db(r["min_snr_db"]) is not None and math.isfinite(_db(r["min_snr_db"]))]
    ceiling = (max(finite) if finite else 60.0) + 10.0  # where an exact (inf dB) artifact is drawn
    floor = (min(finite) if finite else 0.0) - 10.0  # and one with no figure (export error, NaN output)
    for ax, component in zip(axes.flat, components):
        mine = [r for r in rows if r["component"] == component]
        gates = {}
        for r in mine:
            scheme = f"{r['format']} {r['precision']}"
            db = _db(r["min_snr_db"])
            y = ceiling if db is not None and db == math.inf else floor if db is None or not math.isfinite(db) else db
            x = max(r["bytes"], 1) / 1e6
            label = scheme + (f" cal {r['calibration']}" if r["explicit_calibration"] else "")
            if r["verdict"] == "pass":
                ax.scatter(x, y, s=60, color=colour[scheme], edgecolor="black", zorder=3)
            elif r["verdict"] == COARSE_PASS:
                ax.scatter(x, y, s=60, facecolors="none", edgecolors=colour[scheme], linewidths=2, zorder=3)
                label += " (pass, coarse)"
            else:
                ax.scatter(x, y, s=80, color="red", marker="x", linewidths=2.5, zorder=3)
                label += f" ({r['verdict']})"
            ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 4), fontsize=7)
            if r["gate_db"] is not None:  # one line per gate value, in the colour of its first scheme
                gates.setdefault(_db(r["gate_db"]), (colour[scheme], []))[1].append(r["precision"])
        for gate, (c, names) in gates.items():
            ax.axhline(gate, color=c, linestyle="--", linewidth=1)
            ax.annotate(f"gate {'/'.join(dict.fromkeys(names))} {gate:g} dB", (0.01, gate), xycoords=("axes fraction", "data"),
                        textcoords="offset points", xytext=(0, 2), fontsize=7, color=c)
        front = [rows[i] for i in fronts[component]]
        if front:
            ax.plot([max(r["bytes"], 1) / 1e6 for r in front], [min(_db(r["min_snr_db"]), ceiling) for r in front],
                    color="black", linewidth=1, drawstyle="steps-post", zorder=2)
            ax.scatter([max(r["bytes"], 1) / 1e6 for r in front], [min(_db(r["min_snr_db"]), ceiling) for r in front],
                       s=170, facecolors="none", edgecolors="black", zorder=4)
        ax.set_xscale("log")
        ax.margins(x=0.3, y=0.12)  # room for the point labels
        ax.set_title(component)
        ax.set_xlabel("artifact size (MB, log)")
        ax.set_ylabel("min SNR vs fp32 eager (dB)")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(components):]:
        ax.axis("off")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], marker="o", linestyle="", color=colour[s], markeredgecolor="black", label=s) for s in schemes]
    handles.append(Line2D([], [], marker="o", linestyle="", color="grey", markeredgecolor="black", label="passed its gates"))
    if any(r["verdict"] == COARSE_PASS for r in rows):
        handles.append(Line2D([], [], marker="o", linestyle="", color="grey", markerfacecolor="none", markeredgewidth=2,
                              label="pass at a scheme declared too coarse"))
    handles += [Line2D([], [], marker="x", linestyle="", color="red", markeredgewidth=2.5, label="failed its gate"),
                Line2D([], [], marker="o", linestyle="-", color="black", markerfacecolor="none", label="Pareto front (candidates)"),
                Line2D([], [], linestyle="--", color="grey", label="gate (dB, colour of its scheme)")]
    per_line = 3 if width < 12 else 4
    fig.legend(handles=handles, loc="lower center", ncol=per_line, fontsize=8, frameon=False)
    exact = any(_db(r["min_snr_db"]) == math.inf for r in rows if r["min_snr_db"] is not None)
    fig.suptitle(title + (f"  (exact, inf dB, drawn at {ceiling:.0f})" if exact else ""))
    fig.tight_layout(rect=(0, 0.035 * math.ceil(len(handles) / per_line) + 0.01, 1, 0.96))
    temporary = path.with_name(f".{path.name}.tmp")  # renamed into place: never a half-written picture
    fig.savefig(temporary, dpi=110, format="png")
    plt.close(fig)
    os.replace(temporary, path)


def main(argv: list[str] | None = None) -> None:
    """`python -m edgex.sweep.plot DIR`: draw DIR/sweep.png again from DIR/sweep.json."""
    import json
    import sys

    folder = Path((argv or sys.argv[1:] or ["."])[0])
    summary = json.loads((folder / "sweep.json").read_text())
    plot(folder / "sweep.png", f"edgex sweep {summary['model']} -> {summary['target']}", summary["rows"], summary["pareto"])
    print(folder / "sweep.png")


if __name__ == "__main__":
    main()
