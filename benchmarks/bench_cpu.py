"""Benchmark (not a test): export a preset's components for target `cpu` and time the artifacts
against the eager model in the same process, at a fixed thread count.

    .venv/bin/python benchmarks/bench_cpu.py --preset 0.6b --threads 2 --out out-bench
    .venv/bin/python benchmarks/bench_cpu.py --frame --preset 0.6b --threads 2 --out out-bench-frame  # bench_frame.py
    .venv/bin/python benchmarks/bench_cpu.py --model spark-x2.5 --preset 1.7b --components decode \
        --formats executorch --precision 8da4w --set max_context=1024 --threads 2 --out out-bench

Per component x format: export seconds, peak RSS during export, artifact bytes, parity (min SNR
dB), median latency of the artifact in its runtime and of the eager reference (the unmodified
Hugging Face modules) on the same inputs, and the ratio eager / artifact. Medians of --runs
repetitions after one warm-up; the machines are noisy, so read ratios, not absolute numbers.
Runtimes whose call wraps more than the graph report its phases too (llama.cpp: `seed_cache`,
writing the state inputs into its KV cache; `llama_decode`, the graph; `read_outputs`, logits and
the cache read back), so a decode step can be compared without the harness's state round trip.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from edgex.artifacts.files import staging_dir
from edgex.exporters import EXPORTERS
from edgex.parity.check import measure, to_numpy
from edgex.parity.runtimes import RUNTIMES
from edgex.recipes import RECIPES
from edgex.recipes.base import parse_settings
from edgex.resources import PeakRss


def median_seconds(fn, runs: int, phases=lambda: {}) -> tuple[float, dict[str, float]]:
    """Median wall time of `runs` calls after a warm-up, and the median of each phase `phases()`
    reports after a call (a session's `phases`, in ms)."""
    fn()
    times, seen = [], []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        seen.append(phases())
    return statistics.median(times), {k: round(statistics.median(p[k] for p in seen), 2) for k in seen[0]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen3-tts")
    parser.add_argument("--preset", default="0.6b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--formats", default="executorch,onnx")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--components", default="")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="recipe build option (repeatable)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    frame = parser.add_argument_group("--frame: the Qwen3-TTS frame benchmark (bench_frame.py)")
    frame.add_argument("--frame", action="store_true", help="talker step + predictor frame, every engine, one run")
    frame.add_argument("--context", type=int, default=100, help="talker position of the first frame")
    frame.add_argument("--frames", type=int, default=24, help="frames timed and compared")
    frame.add_argument("--onnx", default="fp32,8da8w,8da4w", help="ONNX precisions of both components")
    frame.add_argument("--gguf", default="q8_0,q4_0", help="GGUF precisions of the talker, and of llama.cpp's predictor "
                       "(mmproj) where it is built at that precision: f32, f16, q8_0 (empty: none)")
    frame.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.frame:
        from bench_frame import main as frame_main

        return frame_main(args)

    torch.set_num_threads(args.threads)
    console = Console(stderr=True)
    recipe = RECIPES.get(args.model)
    start = time.perf_counter()
    loaded = recipe.load(args.preset, None, 0, recipe.parse_options(parse_settings(args.set)))
    components = recipe.components(loaded, [c for c in args.components.split(",") if c] or None)
    console.log(f"built {args.preset} components in {time.perf_counter() - start:.1f} s")
    args.out.mkdir(parents=True, exist_ok=True)

    rows = []
    for comp in components:
        inputs = comp.example_inputs
        with torch.no_grad():
            eager, _ = median_seconds(partial(comp.reference, *inputs), args.runs)
        for fmt in args.formats.split(","):
            exporter = EXPORTERS.get(fmt)
            if args.precision not in exporter.precisions:  # an exporter would not refuse it by itself
                console.log(f"skipping {fmt}: it has no precision {args.precision} ({', '.join(exporter.precisions)})")
                continue
            with staging_dir(args.out) as stage:
                t0 = time.perf_counter()
                with PeakRss() as peak:
                    result = exporter.export(comp, args.precision, stage / f"{comp.name}.{args.precision}{exporter.extension}")
                export_s = time.perf_counter() - t0
                size = sum(f.stat().st_size for f in result.files)
                session = RUNTIMES.get(exporter.runtime).load(result.files, args.threads)
                report = measure(comp, session, exporter.runtime, result.io_float_dtype, 0.0)
                arrays = to_numpy(inputs, result.io_float_dtype)
                artifact, phases = median_seconds(partial(session.run, arrays), args.runs, lambda: dict(session.phases))
                del session  # a 0.6b session holds ~1.8 GB: free it before the next export
            row = dict(component=comp.name, format=exporter.format, precision=args.precision,
                       export_s=round(export_s, 1), peak_rss_mb=peak.mb, bytes=size,
                       min_snr_db=report.min_snr_db, artifact_ms=round(artifact * 1e3, 2),
                       eager_ms=round(eager * 1e3, 2), eager_over_artifact=round(eager / artifact, 2),
                       runtime_phases_ms=phases)
            rows.append(row)
            console.print(json.dumps(row), soft_wrap=True)
            gc.collect()

    table = Table(title=f"{args.model} {args.preset} on cpu, {args.threads} threads, median of {args.runs}")
    for col in ("component", "format", "export s", "peak RSS MB", "MB", "min SNR dB", "artifact ms", "eager ms", "eager/artifact", "phases ms"):
        table.add_column(col, justify="left" if col in ("component", "format", "phases ms") else "right")
    for r in rows:
        table.add_row(r["component"], r["format"], f"{r['export_s']:.1f}", f"{r['peak_rss_mb']:.0f}", f"{r['bytes'] / 1e6:.1f}",
                      f"{r['min_snr_db']:.1f}", f"{r['artifact_ms']:.1f}", f"{r['eager_ms']:.1f}", f"{r['eager_over_artifact']:.2f}x",
                      " ".join(f"{k} {v:.1f}" for k, v in r["runtime_phases_ms"].items()))
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    (args.out / "bench.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
