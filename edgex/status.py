"""One rule for the status of a set of verdicts, and its exit code, shared by export, verify and
build (and light: `edgex build merge` runs without torch).

A failed gate or an export error fails; an artifact nothing here could run (parity method `none`,
verdict "unverified") leaves the set "incomplete" unless the user accepted unverified artifacts.
"""

from __future__ import annotations

EXIT_CODES = {"pass": 0, "fail": 1, "incomplete": 3}


def status(verdicts, allow_unverified: bool = False) -> str:
    verdicts = set(verdicts)
    if verdicts & {"fail", "error"}:
        return "fail"
    return "incomplete" if "unverified" in verdicts and not allow_unverified else "pass"
