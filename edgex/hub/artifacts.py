"""What AI Hub is given for an artifact, and which compile options, read from the artifact's files.

The shape of the files decides, not the exporter's name, so a new exporter that writes one of these
shapes needs no change here:
- `.onnx` (+ `.onnx.data`): a float/QDQ graph; AI Hub compiles it to a QNN context binary for the
  device's HTP (`--target_runtime qnn_context_binary`).
- `.onnx` + `.bin`: an EPContext model holding a precompiled QNN context binary; AI Hub wraps it
  as-is (`--target_runtime precompiled_qnn_onnx`).
- `.bin` (QNN context binary) or `.dlc` (QNN IR): already device models, profiled and run directly.
Anything else (ExecuTorch `.pte`, MNN `.mnn` ...) AI Hub does not run; the manifest says so.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

ONNX_COMPANIONS = (".data", ".bin")  # external weights, EPContext binary
DEVICE_MODELS = {".bin": "QNN context binary", ".dlc": "QNN DLC"}


@dataclass(frozen=True)
class Submission:
    upload: Path  # file, or a folder that the client zips (ONNX with companions)
    kind: str
    compile_options: str | None  # None: a device model already, no compile job
    graph: Path | None = None  # the ONNX file, whose inputs may be sliced per layer (`sliced_inputs_of`)


def prepare(files: list[Path], workdir: Path) -> Submission | str:
    """The submission for an artifact (primary file first), or why AI Hub cannot run it."""
    primary = files[0]
    if primary.suffix == ".onnx":
        companions = [f for f in files[1:] if f.suffix in ONNX_COMPANIONS]
        if any(f.suffix == ".bin" for f in companions):
            kind, options = "EPContext ONNX", "--target_runtime precompiled_qnn_onnx"
        else:
            kind, options = "ONNX", "--target_runtime qnn_context_binary"
        return Submission(_folder(primary, companions, workdir) if companions else primary, kind, options, primary)
    if primary.suffix in DEVICE_MODELS:
        return Submission(primary, DEVICE_MODELS[primary.suffix], None)
    return f"AI Hub runs ONNX, QNN context binaries (.bin) and DLCs (.dlc), not {primary.suffix} artifacts"


def _folder(primary: Path, companions: list[Path], workdir: Path) -> Path:
    """AI Hub takes an ONNX model with side files as a folder named like the model (`x.onnx/`)
    holding the `.onnx` and its side files under their own names (the graph refers to them)."""
    folder = workdir / primary.name
    folder.mkdir(parents=True)
    for file in (primary, *companions):
        try:
            os.link(file, folder / file.name)
        except OSError:  # another filesystem: copy
            shutil.copy2(file, folder / file.name)
    return folder
