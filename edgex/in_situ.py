"""`edgex pipeline MODEL DIR`: in-situ parity. A target's exported artifacts, taken from the
manifest in DIR, composed into the model's own pipeline and run against the eager pipeline with the
same seed and the same sampling noise.

A separate command rather than a step of `edgex export`: it needs one artifact of every stage at
once (an export may write only some, or several precisions of each), it runs minutes where one
component's parity runs seconds, and it must be re-runnable on a folder `edgex sweep` or `edgex
build` wrote. Which artifact serves a stage follows the target's placement (its first exporter and
precision for the role), or `--placement` / `@FILE` as for export (a sweep's recommendation, whose
calibration size, where it names one, is matched too). Only an artifact whose own verdict is a pass
serves a stage: a failed or unverified one is refused with its verdict (a one-line error), so a
pipeline verdict never rests on an artifact that failed its gate. A pipeline that passes with a
stage at a scheme its recipe declares too coarse (verdict "pass (coarse)", placed by name) passes as
"pass (coarse)", and its report names those stages and why (`coarse`).

Every artifact used is re-hashed against the manifest first; the report (`pipeline.json` beside
the manifest) names each with its sha256, and the manifest gets a `pipeline` block with the
report's sha256 and the verdict. What is composed and scored is the recipe's (`Recipe.in_situ`):
its stages, and its optional components (`Recipe.in_situ_optional`) where the folders hold them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .artifacts.files import sha256, strict_json, write_json_atomic
from .errors import EdgexError
from .exporters import EXPORTERS
from .parity.gates import threshold_db, tie_db
from .parity.runtimes import RUNTIMES
from .parity.runtimes.base import Session
from .plan import placement_overrides, read_placements
from .recipes import RECIPES
from .recipes.base import stage_options
from .status import PASS, entry_verdict, passed
from .targets import get_target, parse_placement
from .verify import check_checkpoint, find_manifest, load_manifest

REPORT = "pipeline.json"


@dataclass
class Stage:
    """One artifact as a pipeline stage: float32 numpy in and out whatever the artifact's I/O dtype,
    every call timed."""

    component: str
    entry: dict
    session: Session
    gate_db: float
    folder: Path | None = None  # where the entry's files are (the manifest's folder)
    times_ms: list = field(default_factory=list)

    def __call__(self, inputs) -> list[np.ndarray]:
        dtype = self.entry.get("io_float_dtype") or "float32"
        arrays = [np.ascontiguousarray(x, dtype) if np.issubdtype(np.asarray(x).dtype, np.floating) else np.ascontiguousarray(x)
                  for x in inputs]
        start = time.perf_counter()
        outputs = self.session.run(arrays)
        self.times_ms.append((time.perf_counter() - start) * 1000)
        return [np.asarray(o, np.float32) if np.issubdtype(np.asarray(o).dtype, np.floating) else np.asarray(o) for o in outputs]

    @property
    def tie_db(self) -> float:
        """The level whose tie margin decides whether a free-running flip is a near-tie: the same
        rule as a component's parity (`edgex.parity.gates.tie_db`), never the stage's loose policy
        gate: after a flip the rest of an utterance differs."""
        return tie_db(self.gate_db)

    def record(self) -> dict:
        return {"component": self.component, "folder": str(self.folder) if self.folder else None, "format": self.entry["format"], "exporter": self.entry["exporter"],
                "precision": self.entry["precision"], "gate_db": self.gate_db,
                "method": (self.entry.get("parity") or {}).get("method"), "verdict": self.entry.get("verdict"),
                **({"coarse_scheme": self.entry["coarse_scheme"]} if self.entry.get("coarse_scheme") else {}),
                "files": [{"path": f["path"], "sha256": f["sha256"]} for f in self.entry["files"]]}


def _choose(manifests: list[tuple[Path, dict]], recipe, stages: list, placements: list[str]) -> dict[str, tuple[Path, dict]]:
    """The (folder, manifest entry) serving each stage: the placement's exporter and precision (the
    first folder's target's, or `placements`), looked up in the folders in order. A stage given as a
    tuple of alternatives (Qwen3-TTS's predictor: the whole-frame graph or the step graph looped by the
    runner) is served by the one a placement names by component (the last named, when several are:
    `--placement @FILE --placement code_predictor_step=...` picks the step graph over a file naming
    both), else the first one the target places and the folders hold. An alternative may be a tuple of
    components that serve the stage together (Qwen3-TTS's decoder: the streaming pair, or Code2Wav's
    windowed graph): it serves where every one of them does."""
    target = get_target(manifests[0][1]["target"])
    named = {parse_placement(p)[0]: i for i, p in enumerate(placements)}  # key -> where it was last named
    # One artifact serves a stage. --placement adds a placement in every command: export builds each
    # one given, so a key given twice with two values has no single artifact to pick here.
    last: dict[str, str] = {}
    for text in placements:
        key = parse_placement(text)[0]
        if key in last and parse_placement(last[key]) != parse_placement(text):
            raise EdgexError(f"--placement {key} is given twice ({last[key]}, {text}): a pipeline stage is served by one "
                             f"artifact, so give one placement per role or component")
        last[key] = text
    overrides = placement_overrides(recipe, list(last.values())) if placements else {}
    if overrides:
        target = target.with_overrides(overrides, recipe.placement_roles)
    chosen = {}
    for stage in stages:
        options = stage_options(stage)
        options.sort(key=lambda group: -max(named.get(n, -1) for n in group) if named.keys() & set(group) else 1)  # stable
        missing = []
        for group in options:
            found = {}
            for name in group:
                served, why = _serving(manifests, recipe, target, name)
                if served is None:
                    missing.append(why)
                    break
                found[name] = served
            else:
                chosen |= found
                break
        else:
            either = " or ".join(" + ".join(group) for group in options)
            raise EdgexError(f"the {recipe.name} pipeline needs {either}: {'; '.join(missing)} (export it, or pick another "
                             f"with --placement {options[0][0]}=EXPORTER:PRECISION)")
    return chosen


def _serving(manifests: list[tuple[Path, dict]], recipe, target, name: str) -> tuple[tuple[Path, dict] | None, str]:
    """(the folder and passing entry of `name` at the target's placement, or None; why not)."""
    placed = recipe.placements_on(target, name)
    if not placed:
        return None, f"target {target.name} places no {name}"
    if not placed[0].precisions:  # the target's first format leaves this one out (its reason), another option serves
        return None, (f"target {target.name} builds no {placed[0].exporter} {name} by default"
                      f"{f' ({placed[0].recipe_precisions})' if placed[0].recipe_precisions else ''}")
    exporter, precision, calibration = placed[0].exporter, placed[0].precisions[0], placed[0].calibration
    matching = [(root, e) for root, manifest in manifests for e in manifest["artifacts"]
                if e["component"] == name and e["exporter"] == exporter and e["precision"] == precision
                and "sidecar_of" not in e and e.get("files") and _calibrated(e, calibration)]
    found = next(((root, e) for root, e in matching if passed(e.get("verdict"))), None)
    if found is not None:
        return found, ""
    scheme = f"{exporter} {precision}{f' calibration {calibration}' if calibration else ''} {name}"
    if matching:  # only artifacts that passed their own gates compose: a failed one would taint the verdict
        verdicts = ", ".join(sorted({e.get("verdict", "none") for _, e in matching}))
        return None, f"the {scheme} artifact did not pass its gate (verdict {verdicts})"
    return None, f"no {scheme} artifact in the manifest(s)"


def _calibrated(entry: dict, calibration: int | None) -> bool:
    """Whether an entry was calibrated on `calibration` input sets (None: any)."""
    return calibration is None or (entry.get("export_options") or {}).get("calibration_size") == calibration


def _stage(name: str, entry: dict, root: Path, threads: int | None, overrides: dict) -> Stage:
    for record in entry["files"]:
        path = root / record["path"]
        if not path.is_file() or sha256(path) != record["sha256"]:
            raise EdgexError(f"{name}: {path} is missing or differs from the manifest's sha256: re-export it or run edgex verify")
    runtime = RUNTIMES.get(EXPORTERS.get(entry["exporter"]).runtime)
    reason = runtime.unavailable_reason()
    if reason:
        raise EdgexError(f"{name}: {entry['format']} artifacts cannot run here: {reason}")
    session = runtime.load([root / r["path"] for r in entry["files"]], threads)
    return Stage(name, entry, session, threshold_db(entry["role"], entry["precision"], overrides), root)


def pipeline_verdict(failures: list[str], entries: dict[str, dict]) -> tuple[str, dict[str, str]]:
    """The pipeline's verdict from its failures and the entries serving its stages: "fail", "pass",
    or "pass (coarse)" where a stage's artifact is at a scheme its recipe declares too coarse; and
    those stages with the recipe's reason."""
    coarse = {name: entry["coarse_scheme"] for name, entry in entries.items() if entry.get("coarse_scheme")}
    return ("fail" if failures else entry_verdict(PASS, "; ".join(coarse.values()))), coarse


def run_pipeline(directories: list[Path], placements: list[str] | None = None, frames: int | None = None, threads: int | None = None,
                 progress=None, stream_frames: int | None = None, voice: Path | None = None,
                 request: dict | None = None, request_base: Path | None = None) -> dict:
    """Compose, run, score and gate; writes pipeline.json and the `pipeline` block into the first
    folder's manifest. Several folders (of one model source) compose a placement across targets,
    e.g. a talker GGUF from llama-cpp with the predictor and decoder from another folder."""
    import torch

    progress = progress or (lambda _m: None)
    paths = [find_manifest(d) for d in directories]
    manifests = [(p.parent, load_manifest(p)) for p in paths]
    path, manifest = paths[0], manifests[0][1]
    for other, m in manifests[1:]:
        if (m["model"], m["source"], m.get("settings") or {}) != (manifest["model"], manifest["source"], manifest.get("settings") or {}):
            raise EdgexError(f"{other} holds artifacts of another model, weights or --set options than {path.parent}")
    check_checkpoint(manifest["source"])
    recipe = RECIPES.get(manifest["model"])
    names = list(recipe.in_situ_components)  # a tuple inside: alternative components for one stage
    if not names:
        raise EdgexError(f"{recipe.name} has no in-situ pipeline yet")
    overrides = manifest.get("gate_overrides") or {}
    placed = read_placements(placements)
    chosen = _choose(manifests, recipe.facts, names, placed)
    held = {e["component"] for _, m in manifests for e in m["artifacts"] if "sidecar_of" not in e and e.get("files")}
    optional = [n for n in recipe.in_situ_optional if n in held]  # composed where exported
    if optional:
        chosen |= _choose(manifests, recipe.facts, optional, placed)
    stages = {n: _stage(n, e, root, threads, overrides) for n, (root, e) in chosen.items()}
    source = manifest["source"]
    checkpoint = Path(source["checkpoint"]) if "checkpoint" in source else None
    if threads:  # else torch's own choice, as each runtime keeps its own
        torch.set_num_threads(threads)
    progress("building the eager model")
    loaded = recipe.load(source.get("preset"), checkpoint, int(source.get("seed", 0)), recipe.parse_options(manifest.get("settings")))
    progress("running the eager and the artifact pipelines")
    started = time.perf_counter()
    settings = {"frames": frames, "stream_frames": stream_frames}
    if voice is not None:
        settings["voice"] = Path(voice)
    if request is not None:  # the official-utterance request (JSON form; paths in it relative to request_base)
        settings["request"], settings["request_base"] = request, request_base
    report = recipe.in_situ(loaded, stages, settings, progress)
    failures = report.pop("failures")
    simulated = [n for n, s in stages.items() if (s.entry.get("parity") or {}).get("method") == "simulated"]
    if simulated and "timing" in report:  # a simulator's milliseconds are no device's
        report["timing"]["simulated_stages"] = {"stages": simulated, "note": "these ran in a simulator on this host: "
                                                "their times (and the TTFA / RTF / gaps built on them) are not device times"}
    verdict, coarse = pipeline_verdict(failures, {n: s.entry for n, s in stages.items()})
    report = {"model": recipe.name, "target": manifest["target"], "manifest": str(path), "threads": threads,
              "artifacts": [s.record() for s in stages.values()], **report, "failures": failures,
              **({"coarse": coarse} if coarse else {}), "verdict": verdict, "seconds": round(time.perf_counter() - started, 3)}
    report = strict_json(report)
    write_json_atomic(path.parent / REPORT, report)
    manifest["pipeline"] = {"report": REPORT, "sha256": sha256(path.parent / REPORT), "verdict": report["verdict"],
                            "artifacts": [f"{a['component']}.{a['precision']}.{a['format']}" for a in report["artifacts"]]}
    write_json_atomic(path, manifest)
    return report
