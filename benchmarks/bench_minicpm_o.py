"""Benchmark (not a test): MiniCPM-o speech output on CPU, artifacts vs eager in the same process.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_minicpm_o.py --preset 4.5 --threads 2 --out out-bench-minicpmo

Runs `bench_cpu.py` on the streaming path's graphs (`tts_decode`, `flow_encoder`, `flow_chunk`,
`hift`; ONNX Runtime fp32 unless --formats says otherwise) and derives the two figures a device
budget needs: the TTS head's ms per audio token (one `tts_decode` step; 25 tokens make a second)
and the vocoder's ms per second of audio (one 25-token streaming chunk = 50 mel frames = 1 s:
`flow_encoder` + `flow_chunk` (all Euler steps) + `hift` over 50 frames), for the artifacts and
for the eager references (edgex's head on transformers' LlamaModel; the official Token2wav
`encoder.forward_chunk`, `CausalConditionalCFM.forward_chunk` and `HiFTGenerator`), each the
median of --runs calls after a warm-up in the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_cpu  # noqa: E402

VOCODER = ("flow_encoder", "flow_chunk", "hift")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="4.5")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--formats", default="onnx")
    ap.add_argument("--out", type=Path, default=Path("bench-minicpmo"))
    ap.add_argument("--reuse", action="store_true", help="derive the figures from an earlier run's bench.json")
    args = ap.parse_args()
    if not args.reuse:
        bench_cpu.main(["--model", "minicpm-o", "--preset", args.preset, "--threads", str(args.threads),
                        "--runs", str(args.runs), "--formats", args.formats, "--precision", "fp32",
                        "--components", ",".join(("tts_decode",) + VOCODER), "--out", str(args.out)])
    rows = json.loads((args.out / "bench.json").read_text())["rows"]
    best = {}
    for row in rows:  # the fastest format of each component
        if row["component"] not in best or row["artifact_ms"] < best[row["component"]]["artifact_ms"]:
            best[row["component"]] = row
    head = best["tts_decode"]
    vocoder = sum(best[c]["artifact_ms"] for c in VOCODER)
    vocoder_eager = sum(best[c]["eager_ms"] for c in VOCODER)
    formats = ", ".join(f"{c} {best[c]['format']}" for c in ("tts_decode",) + VOCODER)
    print(f"minicpm-o {args.preset}, {args.threads} threads, median of {args.runs} ({formats}):\n"
          f"  TTS head: {head['artifact_ms']:.1f} ms per token vs eager {head['eager_ms']:.1f} "
          f"({head['eager_over_artifact']:.2f}x); {25 * head['artifact_ms']:.0f} ms per second of audio\n"
          f"  vocoder (flow_encoder + flow_chunk + hift, one 1 s chunk): {vocoder:.0f} ms per second of audio vs "
          f"eager {vocoder_eager:.0f} ({vocoder_eager / vocoder:.2f}x); "
          + ", ".join(f"{c} {best[c]['artifact_ms']:.1f} / {best[c]['eager_ms']:.1f}" for c in VOCODER))
    return 0


if __name__ == "__main__":
    sys.exit(main())
