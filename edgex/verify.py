"""`edgex verify`: detect tampered or truncated artifacts (sha256, size) and re-run parity.

Parity is re-measured from scratch: the eager model is rebuilt from the manifest's source (preset +
seed, or checkpoint path), its components re-derived, and every artifact run again in its runtime.
The gate is recomputed from this code and the user's overrides recorded in the manifest
(`gate_overrides`), never read back from the manifest's figures (which no hash covers); a gate that
differs from the recorded one is reported. Status and exit codes follow `edgex export`: an artifact
nothing here can run makes the status "incomplete" unless unverified artifacts are allowed.
"""

from __future__ import annotations

import json
from pathlib import Path

from .artifacts.files import sha256
from .errors import EdgexError
from .export import MANIFEST, run_parity, status
from .exporters import EXPORTERS
from .recipes import RECIPES


def find_manifest(directory: Path) -> Path:
    directory = Path(directory)
    if directory.is_file() and directory.name == MANIFEST:
        return directory
    if (directory / MANIFEST).is_file():
        return directory / MANIFEST
    found = sorted(directory.glob(f"*/*/{MANIFEST}")) if directory.is_dir() else []
    if len(found) == 1:
        return found[0]
    if not found:
        raise EdgexError(f"no {MANIFEST} in {directory} (give the folder edgex export wrote it to)")
    raise EdgexError(f"{len(found)} manifests under {directory}; pick one: {', '.join(str(f.parent) for f in found)}")


def load_manifest(path: Path) -> dict:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EdgexError(f"manifest {path} is unreadable: {exc}") from None
    for key in ("model", "source", "artifacts"):
        if key not in manifest:
            raise EdgexError(f"manifest {path} has no {key!r}: not an edgex manifest")
    return manifest


def _file_problems(entry: dict, root: Path) -> list[str]:
    problems = []
    if not entry.get("files"):
        problems.append("no files recorded")
    for record in entry.get("files", []):
        path = root / record["path"]
        if not path.is_file():
            problems.append(f"{record['path']} is missing")
        elif path.stat().st_size != record["bytes"]:
            problems.append(f"{record['path']} has {path.stat().st_size} bytes, manifest says {record['bytes']}")
        elif sha256(path) != record["sha256"]:
            problems.append(f"{record['path']} sha256 differs from the manifest")
    return problems


def verify_directory(directory: Path, threads: int | None = None, allow_unverified: bool = False) -> dict:
    path = find_manifest(directory)
    manifest = load_manifest(path)
    root = path.parent
    checks = []
    for entry in manifest["artifacts"]:
        problems = _file_problems(entry, root)
        checks.append((entry, problems, not problems and entry.get("verdict") != "error"))
    names = list(dict.fromkeys(entry["component"] for entry, _, rerun in checks if rerun))
    components = _components(manifest, names) if names else {}
    overrides = manifest.get("gate_overrides") or {}
    rows = []
    for entry, problems, rerun in checks:
        row = {k: entry.get(k) for k in ("component", "format", "precision")}
        row["files"] = "ok" if not problems else "BAD"
        if rerun:
            component = components[entry["component"]]
            exporter = EXPORTERS.get(entry["exporter"])
            files = [root / r["path"] for r in entry["files"]]
            report = run_parity(component, exporter, files, entry["io_float_dtype"], entry["precision"], overrides, threads,
                                entry.get("export_options"))
            row.update(min_snr_db=report.min_snr_db, threshold_db=report.threshold_db, method=report.method)
            figures = report.to_json()  # strict JSON: inf as a string
            for figure in ("scheme", "lowering"):  # quantized artifacts: each figure against its own gate
                if figures[figure]:
                    row[figure] = {k: figures[figure][k] for k in ("min_snr_db", "threshold_db", "verdict")}
            recorded = entry.get("parity", {}).get("threshold_db")
            if recorded != report.threshold_db:
                row["note"] = f"gate is {report.threshold_db} dB now, the manifest recorded {recorded} dB"
            if report.verdict == "fail":
                problems += report.failures or ["parity failed"]  # words, never a figure that may be absent
            elif report.verdict == "unverified":
                row["reason"] = report.reason
            row["verdict"] = report.verdict if not problems else "fail"
        else:
            if entry.get("verdict") == "error":
                problems.append(entry.get("error", "export error"))
            row["verdict"] = "fail"
        row["problem"] = "; ".join(problems)
        rows.append(row)
    bad = sum(1 for r in rows if r["verdict"] == "fail")
    return {"manifest": str(path), "status": status(rows, allow_unverified), "problem_count": bad,
            "allow_unverified": allow_unverified, "gate_overrides": overrides, "artifacts": rows}


def _components(manifest: dict, names: list[str]) -> dict:
    """The eager model rebuilt from the manifest's source, and the named components derived in one
    go (they share the recipe's eager samples: one component at a time regenerated them each time)."""
    recipe = RECIPES.get(manifest["model"])
    source = manifest["source"]
    checkpoint = Path(source["checkpoint"]) if "checkpoint" in source else None
    options = recipe.parse_options(manifest.get("settings"))
    loaded = recipe.load(source.get("preset"), checkpoint, int(source.get("seed", 0)), options)
    return {c.name: c for c in recipe.components(loaded, names)}
