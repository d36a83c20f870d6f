"""Benchmark (not a test): the same plan as `edgex export` and as `edgex build run` of a file
holding it, each cold (a fresh output folder, build cache and `EDGEX_CACHE_DIR`), on this machine.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_build_vs_export.py --runs 3 --executors local,ray --out out-bench-build
    PYTHONPATH=. .venv/bin/python benchmarks/bench_build_vs_export.py --matrix --runs 1 --out out-bench-matrix

Default plan: the README demo's (qwen3-tts, tiny preset, target cpu, its default jobs). `--matrix`:
every recipe's default plan on every target family at the tiny preset, as one build file, against
one `edgex export` per (recipe, target) run one after another (their summed wall time). Each run is
its own `edgex` process. Prints each run's wall seconds, the medians, the ratio of each build to
the export, and whether every artifact's verdict and file hashes agree with the export's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

DEMO = [("qwen3-tts", "cpu")]
# One target per family: the HTP phones (s23/s24/s25) differ only in their SoC.
FAMILIES = ("cpu", "s25-htp", "llama-cpp", "mnn", "apple")


def matrix() -> list[tuple[str, str]]:
    """(recipe, target) of every recipe's default plan on every target family that places any of it."""
    from edgex.errors import EdgexError
    from edgex.plan import make_plan
    from edgex.recipes import RECIPES

    pairs = []
    for model in RECIPES.names():
        for target in FAMILIES:
            try:
                make_plan(model, target, Path("unused"), preset="tiny")
            except EdgexError:
                continue
            pairs.append((model, target))
    return pairs


def build_file(pairs: list[tuple[str, str]]) -> str:
    entries = {}
    for model, target in pairs:
        entries.setdefault(model, []).append(target)
    return "".join(f'[[entry]]\nmodel = "{model}"\npreset = "tiny"\ntargets = {json.dumps(targets)}\n\n'
                   for model, targets in entries.items())


def run(args: list[str], cache: Path) -> float:
    """Wall seconds of one `edgex` command; its stderr (the progress lines) in `<cache>.log`."""
    env = dict(os.environ, EDGEX_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore")
    log = cache.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log, "a") as stderr:
        code = subprocess.run([sys.executable, "-m", "edgex", *args], env=env, stdout=subprocess.DEVNULL, stderr=stderr).returncode
    seconds = time.perf_counter() - started
    if code not in (0, 1, 3):  # a failing or incomplete artifact is a result; anything else is not
        raise SystemExit(f"edgex {' '.join(args)} exited {code}: {log.read_text()[-2000:]}")
    return seconds


def digest(entries: list[dict]) -> dict:
    return {(a["component"], a["format"], a["exporter"], a["precision"], a.get("sidecar_of")):
            (a["verdict"], sorted((f["path"], f["sha256"]) for f in a["files"])) for a in entries}


def compare(reference: dict, seen: dict) -> str:
    """How a build's artifacts agree with the exports': verdicts, and sha256 by format (MNN, QNN and
    Core ML do not export the same bytes twice: `edgex.build.reproducible`)."""
    ours = {(pair, key): value for pair, entries in seen.items() for key, value in entries.items()}
    theirs = {(pair, key): value for pair, entries in reference.items() for key, value in entries.items()}
    if ours.keys() != theirs.keys():
        return f"DIFFERENT ARTIFACTS ({len(ours.keys() ^ theirs.keys())} not in both)"
    verdicts = sum(ours[k][0] == theirs[k][0] for k in ours)
    differ: dict[str, int] = {}
    for key in ours:
        if ours[key][1] != theirs[key][1]:
            differ[key[1][2]] = differ.get(key[1][2], 0) + 1
    hashes = "same sha256" if not differ else "sha256 differ: " + ", ".join(f"{n} {fmt}" for fmt, n in sorted(differ.items()))
    return f"{len(ours)} artifacts, {verdicts} same verdicts, {hashes}"


def exports(pairs, root: Path) -> tuple[float, dict]:
    shutil.rmtree(root, ignore_errors=True)
    seconds, seen = 0.0, {}
    for model, target in pairs:
        took = run(["export", model, "--target", target, "--preset", "tiny", "--out", str(root / "out")], root / "cache")
        seconds += took
        manifest = json.loads((root / "out" / model / target / "manifest.json").read_text())
        seen[model, target] = digest(manifest["artifacts"])
        if len(pairs) > 1:
            print(f"  export {model} --target {target}: {took:.1f} s, {len(manifest['artifacts'])} artifacts, "
                  f"{manifest['status']}", flush=True)
    return seconds, seen


def build(pairs, root: Path, executor: str) -> tuple[float, dict]:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / "plan.toml").write_text(build_file(pairs))
    seconds = run(["build", "run", str(root / "plan.toml"), "--out", str(root / "out"), "--executor", executor],
                  root / "cache")
    data = json.loads((root / "out" / "build.json").read_text())
    seen: dict = {}
    for artifact in data["artifacts"]:
        model, target = artifact["folder"].split("/")
        seen.setdefault((model, target), {}).update(digest([artifact]))
    return seconds, seen


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--executors", default="local", help="comma-separated: local, ray")
    ap.add_argument("--matrix", action="store_true", help="every recipe x target family instead of the demo")
    ap.add_argument("--out", type=Path, default=Path("out-bench-build"))
    args = ap.parse_args()
    pairs = matrix() if args.matrix else DEMO
    executors = [e for e in args.executors.split(",") if e]
    print(f"{len(pairs)} (recipe, target) pair(s): {', '.join(f'{m}/{t}' for m, t in pairs)}", flush=True)
    times: dict[str, list[float]] = {"export": [], **{f"build ({e})": [] for e in executors}}
    agree: dict[str, bool] = {}
    for i in range(args.runs):
        builds = {}
        for executor in executors:  # first: a long matrix run stopped midway has its build's figure
            name = f"build ({executor})"
            seconds, builds[name] = build(pairs, args.out / f"build-{executor}", executor)
            times[name].append(seconds)
            print(f"run {i + 1}: {name} {seconds:.1f} s", flush=True)
        seconds, reference = exports(pairs, args.out / "export")
        times["export"].append(seconds)
        print(f"run {i + 1}: export {seconds:.1f} s", flush=True)
        for name, seen in builds.items():
            agree[name] = agree.get(name, True) and seen == reference
            print(f"run {i + 1}: {name} against the export: {compare(reference, seen)}", flush=True)
    base = statistics.median(times["export"])
    print("\n| run | wall s (each) | median s | / export | verdicts and sha256 as the export's |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        same = "-" if name == "export" else ("yes" if agree[name] else "no")
        print(f"| {name} | {', '.join(f'{v:.1f}' for v in values)} | {median:.1f} | {median / base:.2f} | {same} |")


if __name__ == "__main__":
    main()
