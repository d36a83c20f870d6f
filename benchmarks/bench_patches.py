"""Benchmark (not a test): one cold `edgex export` with edgex's speed-up patches of other libraries on,
and one with `EDGEX_THIRD_PARTY_PATCHES=off` (`edgex/patches/`), on this machine.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_patches.py --preset 0.6b --out out-bench-patches
    PYTHONPATH=. .venv/bin/python benchmarks/bench_patches.py --preset tiny -- -c speaker_encoder   # a quick check

Each run is its own `edgex` process with a fresh output folder and `EDGEX_CACHE_DIR`. Prints each
run's wall seconds and, per artifact, whether its verdict and file hashes are the same in both runs;
an artifact whose files differ is listed with both runs' parity figures (`min_snr_db`), so that a
file that differs from one export to the next anyway is told apart by its parity.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def export(root: Path, model: str, target: str, preset: str, switch: str, extra: list[str]) -> tuple[float, dict]:
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    env = dict(os.environ, EDGEX_CACHE_DIR=str(root / "cache"), EDGEX_THIRD_PARTY_PATCHES=switch, PYTHONWARNINGS="ignore")
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "edgex", "export", model, "--target", target, "--preset", preset,
                           "--out", str(root / "out"), *extra], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - started
    (root / "stderr.txt").write_text(proc.stderr)
    written = root / "out" / model / target / "manifest.json"
    # a failing or incomplete artifact is a result (exit 1 or 3 with a manifest); anything else is not
    if proc.returncode not in (0, 1, 3) or not written.is_file():
        raise SystemExit(f"edgex export ({switch}) exited {proc.returncode} after {seconds:.0f} s, "
                         f"{'a' if written.is_file() else 'no'} manifest written: {proc.stderr[-2000:]}")
    manifest = json.loads(written.read_text())
    return seconds, {f"{a['component']} {a['format']} {a['precision']}":
                     (a["verdict"], sorted((f["path"], f["sha256"]) for f in a["files"]),
                      (a.get("parity") or {}).get("min_snr_db")) for a in manifest["artifacts"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3-tts")
    ap.add_argument("--target", default="cpu")
    ap.add_argument("--preset", default="0.6b")
    ap.add_argument("--out", type=Path, default=Path("out-bench-patches"))
    ap.add_argument("extra", nargs="*", help="after --: more `edgex export` options (-c COMPONENT ...)")
    args = ap.parse_args()
    walls, seen = {}, {}
    for switch in ("on", "off"):
        walls[switch], seen[switch] = export(args.out / switch, args.model, args.target, args.preset, switch, args.extra)
        print(f"patches {switch}: {walls[switch]:.1f} s wall, {len(seen[switch])} artifacts", flush=True)
    differ = sorted(k for k in seen["on"] if seen["on"][k][:2] != seen["off"].get(k, (None, None, None))[:2])
    print(f"\n| patches | wall | artifacts | verdicts and sha256 the same as with patches on |")
    print("|---|---|---|---|")
    for switch in ("on", "off"):
        minutes, seconds = divmod(walls[switch], 60)
        same = "-" if switch == "on" else f"{len(seen['on']) - len(differ)} of {len(seen['on'])}"
        print(f"| {switch} | {int(minutes)}:{seconds:04.1f} | {len(seen[switch])} | {same} |")
    for key in differ:
        on, off = seen["on"][key], seen["off"].get(key)
        print(f"differs: {key}: on {on[0]} ({on[2]} dB), off {off[0] if off else 'absent'} ({off[2] if off else '-'} dB)")


if __name__ == "__main__":
    main()
