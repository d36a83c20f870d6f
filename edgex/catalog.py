"""What edgex knows (`edgex list`) and what this machine can run (`edgex doctor`): the registries printed.

`catalog` reads only light declarations (recipe facts, exporter class attributes), so `edgex list`
does not import torch."""

from __future__ import annotations

from .exporters import EXPORTERS
from .parity.runtimes import RUNTIMES
from .precision import PRECISIONS
from .recipes import RECIPES
from .targets import TARGETS
from .toolchain import TOOLCHAINS, version


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
    "onnxscript": ".onnx export", "onnxruntime": ".onnx runtime", "MNN": ".mnn export + runtime",
    "qai-hub": "--hub (Qualcomm AI Hub device jobs)",
    "gguf": ".gguf export", "llama-cpp-python": ".gguf runtime (llama.cpp)",
    "coremltools": ".mlpackage export + reference interpreter",
}


def doctor() -> dict:
    packages = [
        {"package": dist, "version": version(dist), "install": hint, "needed_for": _NEEDED_FOR.get(dist, "")}
        for dist, hint in TOOLCHAINS.values()
    ]
    runtimes = []
    for name, runtime in RUNTIMES.items():
        reason = runtime.unavailable_reason()
        runtimes.append({"name": name, "status": reason or f"available ({runtime.version() or 'version unknown'})"})
    return {"packages": packages, "runtimes": runtimes}
