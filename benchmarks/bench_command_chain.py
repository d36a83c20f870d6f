"""Benchmark (not a test): every command on the folder the command before it wrote, per model, as a
user runs them with no extra flags.

    .venv/bin/python benchmarks/bench_command_chain.py --out out-chain
    .venv/bin/python benchmarks/bench_command_chain.py --models act,qwen3-tts --target s25-htp --out out-chain

Per model: `edgex export MODEL --target T --preset tiny` (the default plan), `edgex verify` of its
folder, `edgex pipeline MODEL` of its folder, `edgex sweep MODEL --target T --preset tiny` into a
folder of its own, then `edgex verify` and `edgex pipeline` of the sweep's folder, `edgex build run`
of a file holding the same entry, then `edgex verify` and `edgex pipeline` of the build's folder;
for qwen3-tts also `scripts/write_checkpoint.py` (a Base checkpoint), `edgex voice-prompt` on it and
`edgex pipeline --voice` with that prompt over an export of the checkpoint. Each step must end in a
verdict (exit 0, 1 or 3) or a one-line `edgex: ...` error (exit 2), never a traceback; the table
says which, with the wall seconds. Exit 1 when any step traced back.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
EDGEX = [sys.executable, "-m", "edgex"]
MODELS = ("qwen3-tts", "minicpm-o", "spark-x2.5", "act", "diffusion-policy", "smolvla", "pi0")


def run(argv: list[str]) -> dict:
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    errors = [line for line in proc.stderr.splitlines() if line.startswith("edgex: ")]
    traced = "Traceback (most recent call last)" in proc.stderr
    if traced:
        outcome = "TRACEBACK"
    elif proc.returncode == 2:
        outcome = "error: " + (errors[-1][len("edgex: "):] if errors else proc.stderr.strip().splitlines()[-1:])
    else:
        outcome = {0: "pass", 1: "fail", 3: "incomplete"}.get(proc.returncode, f"exit {proc.returncode}")
    return {"argv": argv[len(EDGEX):] if argv[:len(EDGEX)] == EDGEX else argv, "returncode": proc.returncode,
            "outcome": outcome, "seconds": round(seconds, 1), "traceback": traced,
            "stderr_tail": proc.stderr[-1500:] if traced else None}


def folder(root: Path, model: str, target: str) -> Path:
    return root / model / target


def chain(model: str, target: str, out: Path) -> list[dict]:
    steps = []
    exported, swept, built = out / "export", out / "sweep", out / "build"
    steps.append(run([*EDGEX, "export", model, "--target", target, "--preset", "tiny", "--out", str(exported)]))
    for root in (exported,):
        steps.append(run([*EDGEX, "verify", str(folder(root, model, target))]))
        steps.append(run([*EDGEX, "pipeline", model, str(folder(root, model, target))]))
    steps.append(run([*EDGEX, "sweep", model, "--target", target, "--preset", "tiny", "--out", str(swept)]))
    sweep_folder = folder(swept, model, target)
    steps.append(run([*EDGEX, "verify", str(sweep_folder)]))
    steps.append(run([*EDGEX, "pipeline", model, str(sweep_folder)]))
    spec = out / "build.toml"
    spec.write_text(f'[[entry]]\nmodel = "{model}"\npreset = "tiny"\ntargets = ["{target}"]\n')
    steps.append(run([*EDGEX, "build", "run", str(spec), "--out", str(built)]))
    build_folder = folder(built, model, target)
    steps.append(run([*EDGEX, "verify", str(build_folder)]))
    steps.append(run([*EDGEX, "pipeline", model, str(build_folder)]))
    return steps


def voice_chain(out: Path) -> list[dict]:
    """A Base checkpoint in the published layout, a voice prompt from it, an export of it, and the
    pipeline speaking with that voice."""
    import numpy as np

    checkpoint, wav, prompt = out / "checkpoint", out / "reference.wav", out / "voice.npz"
    out.mkdir(parents=True, exist_ok=True)
    steps = [run([sys.executable, "scripts/write_checkpoint.py", "qwen3-tts", "--preset", "tiny", "--out", str(checkpoint)])]
    rate = 24000
    t = np.arange(rate * 2) / rate
    audio = (0.3 * np.sin(2 * np.pi * 220 * t) * np.random.default_rng(0).uniform(0.5, 1, t.size)).astype(np.float32)
    import wave

    with wave.open(str(wav), "wb") as f:
        f.setnchannels(1), f.setsampwidth(2), f.setframerate(rate)
        f.writeframes((audio * 32767).astype("<i2").tobytes())
    steps.append(run([*EDGEX, "voice-prompt", "qwen3-tts", "--checkpoint", str(checkpoint), "--audio", str(wav), "--out", str(prompt)]))
    steps.append(run([*EDGEX, "export", "qwen3-tts", "--checkpoint", str(checkpoint), "--target", "cpu", "--out", str(out / "export")]))
    steps.append(run([*EDGEX, "pipeline", "qwen3-tts", str(out / "export" / "qwen3-tts" / "cpu"), "--voice", str(prompt)]))
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--voice-only", action="store_true", help="only qwen3-tts's checkpoint / voice-prompt chain")
    args = parser.parse_args()
    console = Console(width=200)
    table = Table(title=f"command chain, target {args.target}, preset tiny")
    for column in ("model", "command", "outcome", "s"):
        table.add_column(column)
    results = {}
    for model in args.models.split(","):
        steps = chain(model, args.target, args.out / model) if not args.voice_only else []
        if model == "qwen3-tts":
            steps.extend(voice_chain(args.out / model / "voice"))
        results[model] = steps
        for step in steps:
            table.add_row(model, " ".join(step["argv"][:3]), step["outcome"][:110], f"{step['seconds']:.0f}")
            if step["traceback"]:
                console.print(f"[red]{model}: {' '.join(step['argv'])} traced back[/red]\n{step['stderr_tail']}")
    console.print(table)
    (args.out / "chain.json").write_text(json.dumps(results, indent=1))
    return 1 if any(s["traceback"] for steps in results.values() for s in steps) else 0


if __name__ == "__main__":
    sys.exit(main())
