"""Benchmark (not a test): each recipe's published-size presets exported on each target family that
places them, each `edgex export` in its own process, with no flags beyond the target and preset.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_real_size.py --out out-real-size
    PYTHONPATH=. .venv/bin/python benchmarks/bench_real_size.py --models act --targets cpu --out out-real-size

Per (model, preset, target): `/usr/bin/time -v edgex export MODEL --target T --preset P --out ...`,
and from its output: the exit status, the wall time, the peak memory (the largest process's maximum
RSS as `time -v` reports it, and the process tree's summed PSS, sampled every 2 s), the disk the
folder takes and the bytes of the artifacts the manifest records (all, and those that passed), the
verdict counts, and the thinnest margin over a gate (an artifact's deciding figure minus its gate, in
dB, from manifest.json). A pair the target does not place is a row marked "not placed", nothing run.

Each finished row is appended to `<out>/real_size.jsonl` at once, and a row already there is not run
again (`--redo` runs it again): a long run can stop and resume, or be done in pieces (`--models`,
`--targets`, `--presets`). Budgets, flagged per row: a preset of at most 1B parameters (as its name or
description states the size) within 15 minutes and 12 GB, a larger one within 45 minutes and 24 GB.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_build_vs_export import FAMILIES  # noqa: E402  (one target per family, as the build matrix has them)

ROOT = Path(__file__).resolve().parent.parent
ROWS = "real_size.jsonl"
GB = 1e9
# (largest parameter count, wall minutes, peak GB) of each budget, smallest first.
BUDGETS = ((1e9, 15, 12), (math.inf, 45, 24))


def budget(parameters: float | None) -> tuple[int, int]:
    """(wall minutes, peak GB) a preset of `parameters` is held to; an unstated size gets the
    smallest budget."""
    for limit, minutes, peak_gb in BUDGETS:
        if parameters is None or parameters <= limit:
            return minutes, peak_gb
    raise AssertionError("the last budget has no limit")


def db_margin(entry: dict) -> float | None:
    """An artifact's margin over its deciding gate, in dB (negative: under it): the manifest's `gate`
    record, the check that decided the verdict, which for a pass is the figure closest to its gate.
    None where the entry holds no dB figure (unverified, errored)."""
    gate = entry.get("gate") or {}
    figure, limit = gate.get("min_snr_db"), gate.get("threshold_db")
    if figure is None or limit is None:
        return None
    return float(figure) - float(limit)  # float(): strict JSON writes an infinite figure as a string


def thinnest(manifest: dict) -> tuple[float | None, str | None]:
    """The smallest margin over a gate among the manifest's artifacts, and which artifact and figure
    (end-to-end, lowering, scheme ...) has it."""
    margins = [(m, f"{e['component']}.{e['precision']}.{e['format']}, {e['gate'].get('figure')}")
               for e in manifest.get("artifacts", []) if (m := db_margin(e)) is not None]
    return min(margins, key=lambda pair: pair[0]) if margins else (None, None)


def artifact_bytes(manifest: dict, verdicts: tuple[str, ...] | None = None) -> int:
    return sum(f.get("bytes", 0) for e in manifest.get("artifacts", []) if verdicts is None or e.get("verdict") in verdicts
               for f in e.get("files", []))


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def time_v(stderr: str) -> dict:
    """Wall seconds and maximum RSS (bytes) from GNU time's `-v` block."""
    found = {}
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith("Maximum resident set size (kbytes):"):
            found["max_rss_bytes"] = int(line.rsplit(":", 1)[1]) * 1024
        elif line.startswith("Elapsed (wall clock) time"):
            clock = line.rsplit(" ", 1)[1].split(":")
            found["time_wall_s"] = sum(float(part) * 60 ** i for i, part in enumerate(reversed(clock)))
    return found


class TreeMemory:
    """The summed PSS of a process and its descendants, sampled every `every` seconds: forked export
    jobs share the eager model's pages, which a sum of RSS would count once per job."""

    def __init__(self, pid: int, every: float = 2.0):
        self.pid, self.every, self.peak = pid, every, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                root = psutil.Process(self.pid)
                total = 0
                for proc in (root, *root.children(recursive=True)):
                    try:
                        total += proc.memory_full_info().pss
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        pass
                self.peak = max(self.peak, total)
            except psutil.NoSuchProcess:
                return
            self._stop.wait(self.every)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def placed(model: str, preset: str, target: str) -> str | None:
    """None where `target` places some of `model`'s components; else edgex's one-line reason."""
    from edgex.errors import EdgexError
    from edgex.plan import make_plan

    try:
        make_plan(model, target, Path("unused"), preset=preset)
    except EdgexError as exc:
        return str(exc)
    return None


def export_row(model: str, preset: str, target: str, out: Path, timeout_s: float | None) -> dict:
    folder_root = out / "exports" / preset
    folder = folder_root / model / target
    argv = ["/usr/bin/time", "-v", sys.executable, "-m", "edgex", "export", model, "--target", target, "--preset", preset,
            "--out", str(folder_root)]
    log = out / "logs" / f"{model}-{preset}-{target}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "w") as stderr:
        # its own process group: a timeout stops the export and its forked jobs, not `time` alone
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, cwd=ROOT, start_new_session=True)
        memory = TreeMemory(proc.pid)
        try:
            returncode = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            returncode = proc.wait()
        tree_pss = memory.stop()
    wall = time.perf_counter() - started
    text = log.read_text(errors="replace")
    row = {"exit": returncode, "wall_s": round(wall, 1), "tree_pss_bytes": tree_pss, **time_v(text), "log": str(log),
           "traceback": "Traceback (most recent call last)" in text}
    errors = [line for line in text.splitlines() if line.startswith("edgex: ")]
    if errors:
        row["error"] = errors[-1]
    manifest_path = folder / "manifest.json"
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
        margin, where = thinnest(manifest)
        row.update(status=manifest.get("status"), verdicts=dict(Counter(e.get("verdict") for e in manifest.get("artifacts", []))),
                   folder_bytes=folder_bytes(folder), artifact_bytes=artifact_bytes(manifest),
                   passed_bytes=artifact_bytes(manifest, ("pass", "pass (coarse)")), thinnest_margin_db=margin,
                   thinnest_artifact=where)
    return row


def over_budget(row: dict) -> list[str]:
    minutes, peak_gb = row["budget"]
    peak = max(row.get("max_rss_bytes", 0), row.get("tree_pss_bytes", 0))
    over = []
    if row.get("wall_s", 0) > minutes * 60:
        over.append(f"wall > {minutes} min")
    if peak > peak_gb * GB:
        over.append(f"peak > {peak_gb} GB")
    return over


def read_rows(path: Path) -> dict[tuple[str, str, str], dict]:
    rows = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                rows[row["model"], row["preset"], row["target"]] = row
    return rows


def published_presets(recipe) -> list[str]:
    """A recipe's presets other than its default (the tiny one tests and the demo use)."""
    return [name for name in recipe.presets if name != recipe.default_preset]


def table(rows: list[dict]) -> Table:
    def gb(value):
        return f"{value / GB:.2f}" if value else "-"

    out = Table(title="published-size exports")
    for column in ("model", "preset", "target", "exit", "status", "wall s", "max RSS GB", "tree PSS GB", "folder GB",
                   "artifacts GB (passed)", "verdicts", "thinnest margin dB", "budget"):
        out.add_column(column)
    for r in rows:
        if r.get("not_placed"):
            out.add_row(r["model"], r["preset"], r["target"], "-", "not placed", *["-"] * 8)
            continue
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted((r.get("verdicts") or {}).items()))
        margin = r.get("thinnest_margin_db")
        margin = "-" if margin is None else f"{margin:.1f} ({r['thinnest_artifact']})"
        status = r.get("status") or ("TRACEBACK" if r.get("traceback") else r.get("error", "-")[:60])
        over = ", ".join(r["over_budget"]) or f"ok ({r['budget'][0]} min, {r['budget'][1]} GB)"
        out.add_row(r["model"], r["preset"], r["target"], str(r["exit"]), status, f"{r['wall_s']:.0f}",
                    gb(r.get("max_rss_bytes")), gb(r.get("tree_pss_bytes")), gb(r.get("folder_bytes")),
                    f"{gb(r.get('artifact_bytes'))} ({gb(r.get('passed_bytes'))})", verdicts or "-", margin, over)
    return out


def main() -> int:
    from edgex.recipes import RECIPES
    from edgex.recipes.base import stated_parameters

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(RECIPES.names()))
    parser.add_argument("--targets", default=",".join(FAMILIES))
    parser.add_argument("--presets", default=None, help="comma-separated presets (default: each recipe's published ones)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--redo", action="store_true", help="run rows the JSONL already holds again")
    parser.add_argument("--timeout-min", type=float, default=None, help="kill an export after this many minutes")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / ROWS
    done = read_rows(path)
    console = Console(width=220)
    shown = []
    for model in args.models.split(","):
        recipe = RECIPES.facts(model)
        presets = published_presets(recipe) if args.presets is None else [p for p in args.presets.split(",") if p in recipe.presets]
        for preset in presets:
            parameters = stated_parameters(preset, recipe.presets[preset])
            for target in args.targets.split(","):
                key = (model, preset, target)
                if key in done and not args.redo:
                    shown.append(done[key])
                    continue
                row = {"model": model, "preset": preset, "target": target, "parameters": parameters,
                       "budget": budget(parameters)}
                reason = placed(model, preset, target)
                if reason is not None:
                    row.update(not_placed=reason)
                else:
                    console.print(f"{model} {preset} -> {target} ...", highlight=False)
                    timeout = args.timeout_min * 60 if args.timeout_min else None
                    row.update(export_row(model, preset, target, args.out, timeout))
                    row["over_budget"] = over_budget(row)
                row["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
                with open(path, "a") as f:
                    f.write(json.dumps(row) + "\n")
                shown.append(row)
    console.print(table(shown))
    return 1 if any(r.get("traceback") for r in shown) else 0


if __name__ == "__main__":
    sys.exit(main())
