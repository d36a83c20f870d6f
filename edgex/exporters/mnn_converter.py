"""MNN's converter (the C extension `_tools.mnnconvert`), run in a child interpreter: it prints from
native code and may abort on a bad graph. Never `MNN.tools.mnnconvert`/`mnnquant` or the
`mnnconvert` script: importing `MNN.tools` pip-installs a logging SDK into the running interpreter
and uploads telemetry (docs/toolchains.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

_CONVERT = "import sys, _tools; _tools.mnnconvert(sys.argv[1:])"


def run_converter(argv: list[str], dest: Path) -> str:
    """Run MNN's converter with `argv` writing `dest`; returns its log. It returns success even when
    it fails, so success is the output file existing and being non-empty."""
    dest.unlink(missing_ok=True)
    # The converter writes scratch files under fixed names in its working directory: concurrent
    # conversions sharing one produced broken graphs (measured: zero logits). Give each its own.
    with tempfile.TemporaryDirectory(prefix="mnnconvert-") as scratch:
        env = dict(os.environ, TMPDIR=scratch)
        proc = subprocess.run([sys.executable, "-c", _CONVERT, *argv], capture_output=True, text=True, timeout=3600,
                              cwd=scratch, env=env)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0 or not dest.is_file() or dest.stat().st_size == 0:
        last = [line for line in log.splitlines() if line.strip()][-3:]
        raise RuntimeError(f"MNN converter failed (exit {proc.returncode}): {' | '.join(last)}")
    return log
