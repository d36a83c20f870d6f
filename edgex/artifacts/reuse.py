"""An unchanged re-export: `edgex export` into a folder that already holds the same export.

Every manifest `export_model` writes records its export key (`"export_key": {"sha256", "inputs"}`):
the build cache's key inputs (`edgex.artifacts.keys`: edgex source, Python, machine, model, target,
weights, seed, recipe options, the reference's package versions) with every planned job's inputs in plan order
(component, role, exporter, precision, exporter options, placement, gates, threads, toolchain versions), plus what
else changes the folder's manifest: the gate overrides as given and the accepted unverified kinds. An export
whose key equals the one recorded in `<out>/<model>/<target>/manifest.json`, where every file that
manifest records still has its size and sha256, is that export again: nothing is loaded or built and
the manifest stands.

A miss (the export runs and overwrites): another key (a code change, a tool upgrade, another
precision, seed, gate, selection or checkpoint byte), an altered or missing file, a manifest with
an entry whose export errored (an error may be transient, as in the build cache), a manifest
written before export keys existed or by `edgex build` (its folders gather many calls' artifacts
and record no key), and a missing, unreadable or corrupt manifest. An export with `--hub` records
no key and never reuses: a device run is not reproducible from here.

A miss still reuses what it can, job by job: every entry records its job's own key (`job_key`: the
build cache's key of that one artifact, `edgex.build.cache`), and a planned job whose key equals that
of an earlier entry in the folder's manifest, none of whose entries errored and whose files are all
intact, keeps those entries and files (`reusable_jobs`, marked `"reused": true`); only the other jobs
are built. So changing one component's placement, precision or gate rebuilds that component's
artifacts alone; a change of code, tools, weights, seed or `--set` rebuilds every one. Jobs found
by the same key in another folder's export are reused through `EDGEX_ARTIFACT_CACHE`
(`edgex.artifacts.across`).

Light on import (no torch): the CLI looks before it imports the export pipeline, so a hit takes
about a second.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EdgexError
from ..status import EXIT_CODES
from .files import MANIFEST, intact
from .keys import digest, environment, job_inputs, source_inputs, weights_inputs

if TYPE_CHECKING:
    from ..plan import ExportPlan


def export_key(plan: ExportPlan, *, seed: int, settings: dict[str, str] | None, min_db: dict[str, float] | None,
               threads: int | None, allow_unverified: list[str]) -> dict:
    """The key of one export call: what its artifacts, verdicts and manifest are a function of.
    A checkpoint is hashed file by file here, before anything reads it for the export."""
    overrides = dict(min_db or {})
    weights = weights_inputs(plan.recipe.name, plan.preset or plan.recipe.default_preset, plan.checkpoint)
    inputs = {**environment(),
              **source_inputs(plan.recipe.name, plan.target.name, weights, seed, settings or {}),
              "jobs": [job_inputs(job, overrides, threads) for job in plan.jobs],
              "gate_overrides": overrides, "allow_unverified": allow_unverified}
    return {"sha256": digest(inputs), "inputs": inputs}


# What an export key holds beyond one artifact's key: the plan's jobs, and what changes only the manifest.
_EXPORT_ONLY = ("jobs", "gate_overrides", "allow_unverified")


def job_keys(key: dict) -> list[str]:
    """Each planned job's own key, in plan order: the export's environment and source inputs with
    that job's inputs, the same digest the build cache files one artifact under."""
    common = {k: v for k, v in key["inputs"].items() if k not in _EXPORT_ONLY}
    return [digest({**common, **job}) for job in key["inputs"]["jobs"]]


def reusable_jobs(folder: Path, keys: list[str]) -> dict[str, list[dict]]:
    """Job key -> the entries (the artifact's, then its sidecars') an earlier export recorded in
    `folder`'s manifest for a job with that key, for each of `keys` whose entries all passed, failed
    or stayed unverified (an error may be transient) and whose every recorded file is intact."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text())
        grouped: dict[str, list[dict]] = {}
        for entry in manifest["artifacts"]:
            if entry.get("job_key") in keys:
                grouped.setdefault(entry["job_key"], []).append(entry)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # unreadable or not a manifest: nothing to reuse
        return {}
    return {key: entries for key, entries in grouped.items()
            if all(e.get("verdict") != "error" for e in entries) and _intact(entries, Path(folder))}


def _intact(entries: list[dict], root: Path) -> bool:
    try:
        return intact({"artifacts": entries}, root)
    except (KeyError, TypeError, OSError):
        return False


def unchanged(folder: Path, key: dict) -> dict | None:
    """The manifest in `folder` if an export with `key` wrote it, none of its entries errored and
    every file it records is intact (returned with `manifest_path` and `"reused": true`); else None."""
    path = Path(folder) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
        recorded = manifest.get("export_key") or {}
        if recorded.get("sha256") != key["sha256"] or any(a["verdict"] == "error" for a in manifest["artifacts"]):
            return None
        if manifest["status"] not in EXIT_CODES or not isinstance(manifest["created"], str):
            return None
        if not intact(manifest, path.parent):
            return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # unreadable or not a manifest: a miss
        return None
    return {**manifest, "manifest_path": str(path), "reused": True}



def unchanged_export(plan: ExportPlan, *, seed: int, settings: dict[str, str] | None, min_db: dict[str, float] | None,
                     threads: int | None, allow_unverified: list[str]) -> dict | None:
    """The manifest of an unchanged earlier export into the plan's folder (`unchanged`), found
    before the export pipeline (torch, the toolchains) is imported: a hit takes about a second.
    Gate overrides are checked first, as `export_model` checks them: bad input fails either way."""
    from ..parity.gates import check_overrides

    check_overrides(min_db, set(plan.recipe.components.values()))
    key = export_key(plan, seed=seed, settings=settings, min_db=min_db, threads=threads, allow_unverified=allow_unverified)
    return unchanged(plan.out_dir, key)
