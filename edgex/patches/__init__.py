"""Every patch edgex makes to another library's internals, registered in one place.

edgex uses its dependencies through their public APIs. Where a measured gain needs a private
symbol, or a package installed without its dependencies needs a placeholder to import, the patch is
one function in this package's module for that library, registered here with what it patches, the
versions it was checked against, what it saves and when it changes nothing. Nothing else in edgex
assigns to another library's attributes, edits the import system or names a patched symbol
(`tests/test_patches.py` scans the source for it).

Three kinds:
- `SPEED_UP`: a context manager around an export that makes it cheaper and leaves its files byte for
  byte the same. `EDGEX_THIRD_PARTY_PATCHES=off` turns every one off: each export then runs the
  libraries as they ship (`tests/test_patches.py` exports with and without and compares the bytes).
- `REQUIRED`: what a model's import or the embedded Ray cannot do without (placeholders for modules
  a package installed with `--no-deps` imports and never uses, Ray's loopback switch). They stay on
  whatever the switch says, and each is undone when the edgex call that made it returns.
- `READ`: a private function, class or attribute used for what it is, nothing replaced (ExecuTorch's
  own decomposition table, torch's dispatch mode, onnxscript's constant folding pass); the artifact
  or its check is built from it, so it has no off. Each says what public API would replace it.
  Nothing outside this package imports another library's private module or name.

A test fails when an installed library's version differs from the one a patch was checked against,
naming the patch: an upgrade is re-verified (the byte-identity tests run, the patch's docstring
re-read against the new source) and `checked` updated, rather than trusted.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from . import coremltools, executorch, imports, lerobot, onnxruntime, onnxscript, ray, torch_fx, torch_nn, torch_onnx, torch_ops, torch_utils, transformers  # noqa: F401 - they register themselves
from .registry import APPLIED, PATCHES, READ, REQUIRED, SPEED_UP, SWITCH, Patch, enabled, register, switch_environment  # noqa: F401


def installed(distribution: str) -> str | None:
    """The installed version without its local part (`2.13.0+cpu` is torch 2.13.0), or None."""
    try:
        return version(distribution).split("+")[0]
    except PackageNotFoundError:
        return None


def all_patches() -> dict[str, Patch]:
    """Every patch (each module of this package is light: the libraries import inside)."""
    return PATCHES


def version_drift() -> list[str]:
    """One line per patch whose library is installed at another version than it was checked
    against (an absent library is no drift: its patch never runs)."""
    drift = []
    for patch in all_patches().values():
        for dist, checked in patch.checked.items():
            found = installed(dist)
            if found is not None and found != checked:
                drift.append(f"patch {patch.name!r} was checked against {dist} {checked}, {found} is installed")
    return drift


def in_force() -> list[dict]:
    """`edgex doctor`'s list: each patch, whether it is on in this process, and its versions."""
    on = enabled()
    rows = []
    for patch in sorted(all_patches().values(), key=lambda p: p.name):
        versions = {dist: installed(dist) for dist in patch.checked}
        state = "on" if patch.kind != SPEED_UP or on else "off"
        if all(v is None for v in versions.values()):
            state = "inactive (library not installed)"
        rows.append({"name": patch.name, "kind": patch.kind, "state": state, "symbols": list(patch.symbols),
                     "checked": patch.checked, "installed": versions,
                     "version_differs": any(v is not None and v != patch.checked[d] for d, v in versions.items()),
                     "saves": patch.saves, "no_op": patch.no_op})
    return rows
