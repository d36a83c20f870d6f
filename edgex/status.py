"""One rule for the status of a set of manifest entries, and its exit code, shared by export, verify
and build (and light: `edgex build merge` runs without torch).

- A failed gate or an export error fails.
- An entry nothing here could run, or whose stored tensors could not all be read back (verdict
  "unverified"), leaves the set "incomplete" unless the user accepted its kind by name
  (`--allow-unverified KIND`, `allow_unverified = [KIND, ...]` in a build file): `sidecar` (files
  an export writes beside its artifact that run apart from it, a QNN `.dlc`), or a format (`qnn-dlc`,
  `mlpackage`, ...). There is no "accept everything": a missing runtime or a table not read back is
  accepted only where the user names its format.
- Whatever is accepted, a job (one component, exporter and precision: the artifact and its
  sidecars) none of whose entries ran and passed leaves the set "incomplete": accepting sidecars
  never turns an export whose every file went unverified into a pass.
- An empty set is "incomplete": nothing in it ran, so nothing passed (an empty shard or build).

An entry whose scheme its recipe declares too coarse for the component (`coarse_scheme`, built only
when asked for by name) and which passed its gates has the verdict "pass (coarse)": a pass, for the
status and the exit code, that every reader shows as such and that a sweep never recommends
unless asked (`edgex.sweep.recommend`). `passed` is the one test of a passing verdict.
"""

from __future__ import annotations

from collections.abc import Iterable

from .errors import EdgexError

EXIT_CODES = {"pass": 0, "fail": 1, "incomplete": 3}
SIDECAR = "sidecar"
PASS = "pass"
COARSE_PASS = "pass (coarse)"  # a pass of a scheme the recipe declares too coarse for the component
VERDICTS = (PASS, COARSE_PASS, "fail", "error", "unverified")


def passed(verdict: str | None) -> bool:
    """Whether a verdict is a pass, of a coarse scheme or not."""
    return verdict in (PASS, COARSE_PASS)


def entry_verdict(verdict: str, coarse: str | None) -> str:
    """An entry's verdict from its checks' (`verdict`) and its job's coarse reason (`coarse_scheme`):
    a pass of a coarse scheme is "pass (coarse)"."""
    return COARSE_PASS if verdict == PASS and coarse else verdict


def unverified_kinds() -> list[str]:
    """The names `--allow-unverified` takes: `sidecar` and every format an exporter writes."""
    from .exporters import EXPORTERS

    formats = set()
    for _, exporter in EXPORTERS.all_facts():
        formats.add(exporter.format)
        formats.update(exporter.sidecar_formats)
    return [SIDECAR, *sorted(formats)]


def check_unverified_kinds(kinds: Iterable[str] | None, where: str = "--allow-unverified") -> list[str]:
    """The kinds as given, checked (sorted, each once); an unknown name is a one-line error."""
    names = sorted(set(kinds or ()))
    known = unverified_kinds()
    unknown = [k for k in names if k not in known]
    if unknown:
        raise EdgexError(f"{where}: no such kind {unknown[0]!r} (known: {', '.join(known)})")
    return names


def accepted(entry: dict, kinds: Iterable[str]) -> bool:
    """Whether an unverified entry is of a kind the user accepted."""
    kinds = set(kinds or ())
    return bool(SIDECAR in kinds and entry.get("sidecar_of")) or entry.get("format") in kinds


def _job(entry: dict) -> tuple:
    return entry.get("folder"), entry.get("component"), entry.get("exporter") or entry.get("format"), entry.get("precision")


def status(entries: Iterable[dict], allow_unverified: Iterable[str] = ()) -> str:
    entries = list(entries)
    if not entries:
        return "incomplete"
    verdicts = {e["verdict"] for e in entries}
    if verdicts & {"fail", "error"}:
        return "fail"
    if any(e["verdict"] == "unverified" and not accepted(e, allow_unverified) for e in entries):
        return "incomplete"
    jobs: dict[tuple, set[str]] = {}
    for entry in entries:
        jobs.setdefault(_job(entry), set()).add(entry["verdict"])
    return "pass" if all(any(passed(v) for v in found) for found in jobs.values()) else "incomplete"
