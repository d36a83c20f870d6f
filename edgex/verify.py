"""`edgex verify`: detect tampered or truncated artifacts (sha256, size) and re-run parity.

Parity is re-measured from scratch: the eager model is rebuilt from the manifest's source (preset +
seed, or checkpoint path), its components re-derived, and every artifact run again in its runtime.
The gate is recomputed from this code and the user's overrides recorded in the manifest
(`gate_overrides`), never read back from the manifest's figures (which no hash covers); a gate that
differs from the recorded one is reported. Status and exit codes follow `edgex export`: an artifact
nothing here can run makes the status "incomplete" unless its kind is accepted (`edgex.status`). Formats whose files store weights no run reads (a
GGUF's token embedding table) get their stored tensors re-read and scored again too, so a corrupted
weight fails here even where the hashes were rewritten to match. A sidecar entry (a QNN `.dlc`) is
re-run in its own runtime, or stays unverified with its reason where nothing here runs it.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from .artifacts.files import sha256, strict_json
from .artifacts.keys import tree_sha256
from .errors import EdgexError
from .export import MANIFEST, combined_verdict, parity_in
from .exporters import EXPORTERS
from .parity.quantized import quantized_parity, summary
from .parity.tensors import tensor_parity
from .recipes import RECIPES
from .parity.check import entry_gate
from .status import check_unverified_kinds, entry_verdict, status


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


def check_checkpoint(source: dict) -> None:
    """Refuse to rebuild from a checkpoint folder whose content is not the one exported (its
    sha256, as the manifest records it): figures against other weights would verify nothing."""
    recorded = source.get("checkpoint_sha256")
    if "checkpoint" not in source or not recorded:
        return
    try:
        now = tree_sha256(Path(source["checkpoint"]))
    except OSError as exc:
        raise EdgexError(f"cannot read checkpoint {source['checkpoint']}: {exc.strerror or exc}") from None
    if now != recorded:
        raise EdgexError(f"checkpoint {source['checkpoint']} is not the one exported (content sha256 {now[:12]}, the manifest "
                         f"records {recorded[:12]}): restore it, or export again from this checkpoint")


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


def verify_directory(directory: Path, threads: int | None = None, allow_unverified: list[str] | None = None) -> dict:
    allow_unverified = check_unverified_kinds(allow_unverified)
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
    facts = RECIPES.facts(manifest["model"])
    rows = []
    for entry, problems, rerun in checks:
        row = {k: entry.get(k) for k in ("component", "format", "exporter", "precision")}
        if "sidecar_of" in entry:
            row["sidecar_of"] = entry["sidecar_of"]
        row["files"] = "ok" if not problems else "BAD"
        if rerun:
            # A scheme asked for by name although declared too coarse is judged as at export, if
            # the recipe still declares it so (the manifest's word alone waives nothing).
            coarse = facts.coarse_reason(entry["component"], entry["precision"]) if entry.get("coarse_scheme") else None
            row.update(_rerun(entry, components[entry["component"]], [root / r["path"] for r in entry["files"]], overrides, threads,
                              problems, coarse))
        else:
            if entry.get("verdict") == "error":
                problems.append(entry.get("error", "export error"))
            row["verdict"] = "fail"
        row["problem"] = "; ".join(problems)
        rows.append(row)
    bad = sum(1 for r in rows if r["verdict"] == "fail")
    return strict_json({"manifest": str(path), "status": status(rows, allow_unverified), "problem_count": bad,
                        "allow_unverified": allow_unverified, "gate_overrides": overrides, "artifacts": rows})


def _rerun(entry: dict, component, files: list[Path], overrides: dict, threads, problems: list[str],
           coarse: str | None = None) -> dict:
    """Parity again for one entry whose files match the manifest, under the gate this code gives it
    with the recorded user overrides; stored tensors too for files that declare them (a sidecar's
    own: QNN's `.dlc`). Failures are appended to `problems`."""
    exporter = EXPORTERS.get(entry["exporter"])
    sidecar = "sidecar_of" in entry
    runtime = entry["runtime"] if sidecar else exporter.runtime
    try:
        scheme = None if sidecar else partial(exporter.scheme_reference, component, entry["precision"], files,
                                              **(entry.get("export_options") or {}))
        report = parity_in(runtime, entry["parity"].get("reason"), component, files, entry["io_float_dtype"],
                           entry["precision"], overrides, threads, scheme, coarse)
    except Exception as exc:  # noqa: BLE001 - an artifact its runtime cannot load or run fails, never crashes verify
        problems.append(f"parity run failed: {_one_line(exc)}")
        return {"verdict": "fail"}
    row = {"min_snr_db": report.min_snr_db, "threshold_db": report.threshold_db, "method": report.method}
    figures = report.to_json()  # strict JSON: inf as a string
    if report.min_waveform_snr_db is not None:  # spectral outputs: their SNR, recorded beside the gated figures
        row["min_waveform_snr_db"] = report.min_waveform_snr_db
        row["min_waveform_correlation"] = figures["min_waveform_correlation"]
    if figures["max_action_error"] is not None:  # action outputs: the worst dimension's error, gated too
        row["max_action_error"] = figures["max_action_error"]
    for figure in ("scheme", "lowering"):  # quantized and fp16 artifacts: each figure against its own gate
        if figures[figure]:
            row[figure] = {k: figures[figure][k] for k in ("min_snr_db", "threshold_db", "verdict")}
    recorded = entry.get("parity", {}).get("threshold_db")
    if recorded != report.threshold_db:
        row["note"] = f"gate is {report.threshold_db} dB now, the manifest recorded {recorded} dB"
    if report.verdict == "fail":
        problems.extend(report.failures or ["parity failed"])  # words, never a figure that may be absent
    if report.method == "none":
        row["reason"] = report.reason
    tensors = _tensor_rerun(exporter, component, files, report.threshold_db, entry["precision"], entry.get("export_options"), problems)
    if tensors is not None:
        row["tensor_min_snr_db"] = tensors["min_snr_db"]
        if tensors.get("unverified") and report.method != "none":
            row["reason"] = tensors["unverified"]
    quantized = _quantized_rerun(exporter, component, files, entry["precision"], entry.get("export_options"), problems)
    if quantized is not None:
        row["quantized_min_agreement_db"] = quantized.get("min_agreement_db")
        if quantized.get("unverified") and report.method != "none":
            row["reason"] = quantized["unverified"]
    row["verdict"] = "fail" if problems else entry_verdict(combined_verdict(report.verdict, tensors and tensors["verdict"], None,
                                                                            quantized and quantized["verdict"]), coarse)
    gate = entry_gate(figures, tensors, quantized)
    if gate:
        row["gate"] = gate
    if coarse:
        row["coarse_scheme"] = coarse
    return row


def _quantized_rerun(exporter, component, files: list[Path], precision: str, options: dict | None,
                     problems: list[str]) -> dict | None:
    """Every stored quantized tensor read from the files again and scored against the independent
    quantizer (`edgex.parity.quantized`); a failing one is named in `problems`."""
    try:
        block = quantized_parity(exporter, component, files, precision, options)
    except Exception as exc:  # noqa: BLE001 - a file its own reader cannot parse is a failed check, not a crash
        problems.append(f"stored quantized tensors unreadable: {_one_line(exc)}")
        return {"min_agreement_db": None, "verdict": "fail"}
    if block is not None and block["verdict"] == "fail":
        problems.append(summary(block))
    return block


def _tensor_rerun(exporter, component, files: list[Path], gate: float, precision: str, options: dict | None,
                  problems: list[str]) -> dict | None:
    try:
        tensors = tensor_parity(exporter, component, files, gate, precision, options)
    except Exception as exc:  # noqa: BLE001 - a file its own reader cannot parse is a failed check, not a crash
        problems.append(f"stored tensors unreadable: {_one_line(exc)}")
        return {"min_snr_db": None, "verdict": "fail"}
    if tensors is not None and tensors["verdict"] == "fail":
        problems.append(tensors["failure"])
    return tensors


def _components(manifest: dict, names: list[str]) -> dict:
    """The eager model rebuilt from the manifest's source, and the named components derived in one
    go (they share the recipe's eager samples: one component at a time regenerated them each time)."""
    recipe = RECIPES.get(manifest["model"])
    source = manifest["source"]
    check_checkpoint(source)
    checkpoint = Path(source["checkpoint"]) if "checkpoint" in source else None
    options = recipe.parse_options(manifest.get("settings"))
    loaded = recipe.load(source.get("preset"), checkpoint, int(source.get("seed", 0)), options)
    return {c.name: c for c in recipe.components(loaded, names)}


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
