"""What AI Hub is given for an artifact, and which compile and run options, read from the
artifact's files and where its placement runs it (`Placement.compute_unit`: npu, gpu, cpu).

The shape of the files and the placement decide, not the exporter's name, so a new exporter that
writes one of these shapes needs no change here:
- `.onnx` (+ `.onnx.data`): a float/QDQ graph, compiled for the processor its placement names:
  the HTP (`npu`: `--target_runtime qnn_context_binary`), the GPU (`gpu`: a QNN DLC run on the QNN
  GPU backend, `--target_runtime qnn_dlc --compute_unit gpu`), or the CPU (`cpu`, and a placement that
  names none: what ONNX Runtime on the CPU verified here, `--target_runtime onnx --compute_unit cpu`);
  the profile and inference jobs run on that compute unit (`--compute_unit ...`).
- `.onnx` + `.bin`: an EPContext model holding a precompiled QNN HTP context binary; AI Hub wraps it
  as-is (`--target_runtime precompiled_qnn_onnx`), run on the HTP.
- `.bin` (QNN context binary): already an HTP model, profiled and run directly; `.dlc` (QNN IR):
  run directly on its placement's compute unit (the HTP when it names none).
Anything else (ExecuTorch `.pte`, MNN `.mnn` ...) AI Hub does not run; the manifest says so.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

ONNX_COMPANIONS = (".data", ".bin")  # external weights, EPContext binary
DEVICE_MODELS = {".bin": "QNN context binary", ".dlc": "QNN DLC"}


# compute unit -> (what a plain ONNX graph is compiled to for it, its compile options)
ONNX_FOR = {
    "npu": ("HTP context binary", "--target_runtime qnn_context_binary"),
    "gpu": ("QNN DLC for the GPU", "--target_runtime qnn_dlc --compute_unit gpu"),
    "cpu": ("ONNX for the CPU", "--target_runtime onnx --compute_unit cpu"),
}


@dataclass(frozen=True)
class Submission:
    upload: Path  # file, or a folder that the client zips (ONNX with companions)
    kind: str
    compile_options: str | None  # None: a device model already, no compile job
    graph: Path | None = None  # the ONNX file, whose inputs may be sliced per layer (`sliced_inputs_of`)
    compute_unit: str = "npu"  # where the profile and inference jobs run it
    run_options: str = "--compute_unit npu"


def prepare(files: list[Path], workdir: Path, compute_unit: str | None = None) -> Submission | str:
    """The submission for an artifact (primary file first) placed on `compute_unit` (None: the
    CPU for a plain ONNX graph, the HTP for QNN files), or why AI Hub cannot run it."""
    primary = files[0]
    if compute_unit is not None and compute_unit not in ONNX_FOR:
        return f"no AI Hub compute unit {compute_unit!r} (known: {', '.join(ONNX_FOR)})"
    if primary.suffix == ".onnx":
        companions = [f for f in files[1:] if f.suffix in ONNX_COMPANIONS]
        upload = _folder(primary, companions, workdir) if companions else primary
        if any(f.suffix == ".bin" for f in companions):
            return Submission(upload, "EPContext ONNX (HTP)", "--target_runtime precompiled_qnn_onnx", primary)
        unit = compute_unit or "cpu"
        kind, options = ONNX_FOR[unit]
        return Submission(upload, f"ONNX -> {kind}", options, primary, unit, f"--compute_unit {unit}")
    if primary.suffix == ".bin":
        return Submission(primary, DEVICE_MODELS[".bin"], None)
    if primary.suffix == ".dlc":
        unit = compute_unit or "npu"
        return Submission(primary, DEVICE_MODELS[".dlc"], None, compute_unit=unit, run_options=f"--compute_unit {unit}")
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
