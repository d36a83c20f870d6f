"""What edgex knows (`edgex list`) and what this machine can run (`edgex doctor`): the registries printed.

`catalog` reads only light declarations (recipe facts, exporter class attributes), so `edgex list`
does not import torch."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from .errors import EdgexError
from .exporters import EXPORTERS
from .host import cpu_features, cpu_model
from .parity.runtimes import RUNTIMES
from .patches import in_force
from .precision import PRECISIONS
from .recipes import RECIPES
from .targets import TARGETS
from .toolchain import TOOLCHAINS, native_output_silenced, version


def catalog() -> dict:
    return {
        "models": {
            name: {"description": r.description, "presets": dict(r.presets), "components": dict(r.components),
                   "options": {k: o.description for k, o in r.options.items()}}
            for name, r in RECIPES.all_facts()
        },
        "targets": {
            name: {"description": t.description,
                   "placements": {role: [f"{p.exporter}:{'/'.join(p.precisions)}" for p in ps] for role, ps in t.placements.items()}}
            for name, t in TARGETS.items()
        },
        "formats": {
            name: {"format": e.format, "backend": e.backend, "runtime": e.runtime, "precisions": list(e.precisions),
                   "schemes": dict(e.schemes)}
            for name, e in EXPORTERS.all_facts()
        },
        "precisions": {
            name: {"weights": p.weights, "activations": p.activations, "granularity": p.granularity, "description": p.description}
            for name, p in PRECISIONS.items()
        },
    }


_NEEDED_FOR = {
    "torch": "everything", "transformers": "qwen3-tts reference", "qwen-tts": "qwen3-tts reference",
    "executorch": ".pte export + runtime", "torchao": ".pte quantization", "onnx": ".onnx export",
    "onnxscript": ".onnx export", "onnxruntime": ".onnx runtime",
    "onnxruntime-qnn": "QNN HTP context binaries + HTP simulator", "MNN": ".mnn export + runtime",
    "qai-hub": "--hub (Qualcomm AI Hub device jobs)",
    "gguf": ".gguf export", "llama-cpp-python": ".gguf runtime (llama.cpp)",
    "coremltools": ".mlpackage export + reference interpreter",
}


def doctor(runtimes: list[str] | None = None) -> dict:
    """Toolchain versions, and each runtime's smoke program run here (`Runtime.smoke`): status `ok`
    (it ran and computed the right numbers), `missing` (its optional toolchain is not installed) or
    `failed` (installed but broken, or a required runtime missing). `ok` is False when any failed.
    `runtimes` limits the smoke programs to those registry names. `patches`: what edgex patches in
    other libraries (`edgex.patches.in_force`), each on or off in this process, with its versions."""
    packages = [
        {"package": dist, "version": version(dist), "install": hint, "needed_for": _NEEDED_FOR.get(dist, "")}
        for dist, hint in TOOLCHAINS.values()
    ]
    names = RUNTIMES.names() if runtimes is None else runtimes
    rows = [_smoke(name, RUNTIMES.get(name)) for name in names]
    return {"machine": machine(), "packages": packages, "runtimes": rows, "patches": in_force(),
            "ok": all(r["status"] != "failed" for r in rows)}


def machine() -> dict:
    """Cores, memory and free disk where exports stage their files (the temp folder): a large
    preset's export needs GBs of both, and a full disk or a memory cap is the first thing to rule
    out when exports fail on a CI runner."""
    import psutil

    tmp = Path(tempfile.gettempdir())
    memory = psutil.virtual_memory()
    return {
        "cpu": cpu_model(),
        "cpu_features": cpu_features(),
        "cpus": os.cpu_count(),
        "memory_gb": round(memory.total / 1e9, 1),
        "memory_available_gb": round(memory.available / 1e9, 1),
        "temp_dir": str(tmp),
        "temp_free_gb": round(shutil.disk_usage(tmp).free / 1e9, 1),
    }


def _smoke(name: str, runtime) -> dict:
    row = {"name": name, "required": runtime.required, "version": runtime.version()}
    with tempfile.TemporaryDirectory(prefix="edgex-doctor-") as tmp:
        try:
            with native_output_silenced():  # runtimes print banners natively; --json owns stdout
                detail = runtime.smoke(Path(tmp))
                half = runtime.accumulates_in_half()  # what sets its fp16 artifacts' gates (`parity.half_arithmetic`)
        except EdgexError as exc:  # toolchain not installed
            return {**row, "status": "failed" if runtime.required else "missing", "detail": str(exc)}
        except Exception as exc:  # noqa: BLE001 - any failure of a runtime's own library is the finding
            return {**row, "status": "failed", "detail": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    if half:
        detail += "; sums fp16 products in fp16 on this machine, so fp16 gates follow each component's floor"
    return {**row, "status": "ok", "detail": detail, "fp16_accumulation": "fp16" if half else "fp32"}
