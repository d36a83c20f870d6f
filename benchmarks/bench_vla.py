"""Benchmark (not a test): one SmolVLA control step from the exported artifacts vs LeRobot's eager
policy, in the same process, at a fixed thread count.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_vla.py --preset 450m --threads 2 --runs 10 --out out-bench-vla

A control step is what a robot runs per action chunk: the vision encoder once (every camera in one call), the
prefix, and the whole Euler loop (`action_loop`), here as ONNX fp32 on ONNX Runtime CPU. The eager
side is LeRobot's `select_action` from a reset policy (its preprocessed observation, the same noise).
Reports p50 / p95 and jitter ((p95 - p50) / p50) of both, the ratio eager / artifacts, and the
chained artifacts' SNR against the eager chunk. The first run of each is a warm-up.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import numpy as np
import torch


def _percentile(values, q):
    return float(np.percentile(np.asarray(values), q))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="450m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("out-bench-vla"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import onnxruntime as ort

    from edgex.export import export_model
    from edgex.parity.runtimes.onnxruntime import OrtSession
    from edgex.recipes import RECIPES
    from edgex.recipes.smolvla.recipe import Builder

    t0 = time.perf_counter()
    manifest = export_model("smolvla", "cpu", args.out, preset=args.preset, formats=["onnx"], precisions=["fp32"],
                            components=["vision_encoder", "prefix", "action_loop"], threads=args.threads)
    export_s = time.perf_counter() - t0
    for a in manifest["artifacts"]:
        print(f"{a['component']}: {a['parity']['min_snr_db']:.1f} dB ({a['verdict']}), {a['files'][0]['bytes'] / 1e6:.0f} MB")

    loaded = RECIPES.get("smolvla").load(args.preset, None, 0, {})
    policy = loaded.models
    obs = Builder(policy, 0, loaded.options["steps"]).observation(777)
    folder = args.out / "smolvla" / "cpu"
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    sessions = {n: OrtSession(ort.InferenceSession(str(folder / f"{n}.fp32.onnx"), options))
                for n in ("vision_encoder", "prefix", "action_loop")}
    short = policy.camera_names

    def artifacts():
        tokens = sessions["vision_encoder"].run_named({f"image_{s}": img.numpy() for s, img in zip(short, obs["images"])})
        feed = {f"image_tokens_{s}": t for s, t in zip(short, tokens)}
        feed |= {"lang_tokens": obs["tokens"].numpy(), "lang_mask": obs["mask"].float().numpy(), "state": obs["state"].numpy()}
        keys, values, mask = sessions["prefix"].run_named(feed)
        return sessions["action_loop"].run_named({"noise": obs["noise"].numpy(), "prefix_key": keys,
                                                  "prefix_value": values, "prefix_mask": mask})[0]

    def eager():
        batch = policy.preprocess({"observation.state": obs["state"], **dict(zip(policy.cameras, obs["images"]))})
        batch["observation.language.tokens"], batch["observation.language.attention_mask"] = obs["tokens"], obs["mask"]
        policy.policy.reset()
        with torch.no_grad():
            first = policy.policy.select_action(batch, noise=obs["noise"])
        return policy.postprocess(torch.stack([first, *policy.policy._queues["action"]], 1)).numpy()

    times = {"artifacts": [], "eager": []}
    results = {}
    for _ in range(args.runs + 1):
        for name, fn in (("artifacts", artifacts), ("eager", eager)):
            t = time.perf_counter()
            results[name] = fn()
            times[name].append((time.perf_counter() - t) * 1000)
    ref, out = results["eager"].astype(np.float64), results["artifacts"].astype(np.float64)
    snr = 10 * math.log10((ref ** 2).sum() / max(((ref - out) ** 2).sum(), 1e-300))
    print(f"smolvla {args.preset}: {len(policy.cameras)} camera(s), {loaded.options['steps']} steps, {args.threads} threads, "
          f"{args.runs} runs after a warm-up; export {export_s:.0f} s; chained artifacts vs eager select_action: {snr:.1f} dB")
    stats = {}
    for name, values in times.items():
        v = values[1:]
        p50, p95 = statistics.median(v), _percentile(v, 95)
        stats[name] = p50
        print(f"  {name:9s} p50 {p50:8.1f} ms  p95 {p95:8.1f} ms  jitter {(p95 - p50) / p50 * 100:5.1f} %")
    print(f"  eager / artifacts (p50): {stats['eager'] / stats['artifacts']:.2f}x")


if __name__ == "__main__":
    main()
