"""Planted-graph-bug matrix: each bug in the exported graph only (`tests/planted_graph.py`), at every
FORMAT:PRECISION some target places by default for the component (`edgex.plan.plan` over every
target, as `scripts/scheme_table.py --defaults` enumerates them), tiny preset, seed 0.

Each row exports the component (faithful, or with the bug planted in its export wrapper) and gates
the artifact as `edgex export` does (`edgex.export.gate_files`: end-to-end, scheme and lowering
figures against the unmodified eager reference, and the stored-tensor checks), then prints the
verdict and the figure that decided it (`stored`: the run passed, a stored tensor failed). A planted bug must fail at every default; the faithful component must pass at every one.
GGUF files hold no graph (llama.cpp builds its own from the file): there the bug is written into the
file where it reaches llama.cpp's graph (`planted_graph.plant_gguf`: the RoPE base in the metadata,
the head's input columns of layer 0's output projection zeroed); bugs with no GGUF form are rows
`not applicable`.

    PYTHONPATH=. python benchmarks/bench_planted_graph.py [-b head_dropped] [-c qwen3-tts/talker_decode]
        [-s coreml:w4 ...] [--skip-precision fp32] [--no-faithful] [--json rows.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "scripts")]

from planted_graph import BUGS, NotApplicable, plant, plant_gguf  # noqa: E402
from scheme_table import default_schemes, measure  # noqa: E402

from edgex.recipes import RECIPES  # noqa: E402

FAITHFUL = "faithful"
# bug -> the components it is planted in (model/component), each a graph a target places by default
MATRIX = {
    "head_dropped": ["qwen3-tts/talker_decode", "minicpm-o/tts_decode", "smolvla/prefix", "act/policy"],
    "rope_base": ["qwen3-tts/talker_decode", "minicpm-o/tts_decode", "spark-x2.5/decode"],
    "noise_ignored": ["qwen3-tts/code_predictor"],
    "euler_zeroed": ["smolvla/action_loop", "pi0/action_loop", "diffusion-policy/action_loop", "minicpm-o/flow"],
    "unnorm_skipped": ["act/policy", "smolvla/action_loop", "diffusion-policy/action_loop", "pi0/action_loop"],
}
FILE_PLANTED = {"gguf": plant_gguf}  # formats whose file holds no graph: the bug is written into the file


def _db(value) -> str:
    return f"{float(value):7.1f}" if value is not None else "      -"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-b", "--bug", action="append", choices=list(BUGS))
    parser.add_argument("-c", "--component", action="append", help="MODEL/COMPONENT")
    parser.add_argument("-s", "--scheme", action="append", help="FORMAT:PRECISION (only these of the defaults)")
    parser.add_argument("--skip-precision", action="append", default=[])
    parser.add_argument("--no-faithful", action="store_true", help="skip the unbroken component's rows")
    parser.add_argument("--json", type=Path, help="rows written after each one; rows already there (but errors) are not run again")
    args = parser.parse_args()
    rows = json.loads(args.json.read_text()) if args.json and args.json.exists() else []
    rows = [r for r in rows if "error" not in r]  # a row that failed to run runs again
    done = {(r["bug"], r["model"], r["component"], r["format_precision"]) for r in rows}
    wanted: dict[str, list[str]] = {}
    for bug, names in MATRIX.items():
        if args.bug and bug not in args.bug:
            continue
        for name in names:
            if not args.component or name in args.component:
                wanted.setdefault(name, []).append(bug)
    print(f"{'bug':15} {'model/component':30} {'format:precision':17} {'verdict':8} {'decided by':11} "
          f"{'e2e':>7} {'scheme':>7} {'lowering':>8}  gates e2e/lowering  first failure", flush=True)
    for name, bugs in wanted.items():
        model, component_name = name.split("/")
        recipe = RECIPES.get(model)
        (component,) = recipe.components(recipe.load("tiny", None, 0), [component_name])
        schemes = [s for s in default_schemes(model)[component_name]
                   if (not args.scheme or s in args.scheme) and s.split(":")[1] not in args.skip_precision]
        for bug in ([] if args.no_faithful else [FAITHFUL]) + bugs:
            todo = [s for s in schemes if (bug, model, component_name, s) not in done]
            graph = component if bug == FAITHFUL or not todo else plant(component, bug)
            for scheme in todo:
                exporter, precision = scheme.split(":")
                edit, target = None, graph
                if exporter in FILE_PLANTED and bug != FAITHFUL:
                    target = component
                    edit = (lambda files, fn=FILE_PLANTED[exporter], bug=bug: fn(files[0], bug))
                with tempfile.TemporaryDirectory() as tmp:
                    try:
                        row = measure(target, exporter, precision, Path(tmp), edit)
                    except NotApplicable as exc:
                        row = {"error": f"not applicable: {exc}"}
                    except Exception as exc:  # noqa: BLE001 - a table row, not a crash
                        traceback.print_exc()
                        row = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]}
                rows.append({"bug": bug, "model": model, "component": component_name, "format_precision": scheme, **row})
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=1, default=str))
                if "error" in row:
                    print(f"{bug:15} {name:30} {scheme:17} {row['error']}", flush=True)
                    continue
                failure = row["failures"][0][:110] if row["failures"] else ""
                print(f"{bug:15} {name:30} {scheme:17} {row['verdict']:8} {(row['gate'] or {}).get('figure', '-'):11} {_db(row['e2e'])} "
                      f"{_db(row['scheme'])} {_db(row['lowering']):>8}  {row['e2e_gate']:g}/{row['lowering_gate'] or '-'}"
                      f"  {failure}  ({row['seconds']} s)", flush=True)


if __name__ == "__main__":
    main()
