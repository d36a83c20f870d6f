"""Shared fixtures: the tiny preset built once, and one real CPU export run through the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EDGEX = [sys.executable, "-m", "edgex"]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([*EDGEX, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=3600)


@pytest.fixture(scope="session")
def tiny():
    """The tiny qwen3-tts preset and all its components (samples from the eager pipeline)."""
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    loaded = recipe.load("tiny", None, 0)
    return loaded, {c.name: c for c in recipe.components(loaded)}


@pytest.fixture(scope="session")
def cpu_export(tmp_path_factory):
    """`edgex export qwen3-tts --target cpu --preset tiny --out D --json`, the README demo, in two
    worker processes (CI has 2 cores; the artifacts are the same as with one)."""
    out = tmp_path_factory.mktemp("cpu-export")
    proc = run_cli("export", "qwen3-tts", "--target", "cpu", "--preset", "tiny", "--out", str(out), "--json", "--jobs", "2")
    return out, proc
