"""Device profiles: which format, backend and precisions each component role gets."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import EdgexError


@dataclass(frozen=True)
class Placement:
    exporter: str  # registered exporter name
    precisions: tuple[str, ...]  # default precisions for this role on this target


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    placements: dict[str, tuple[Placement, ...]]  # role -> placements; "*" for any other role
    facts: dict = field(default_factory=dict)

    def placements_for(self, role: str) -> tuple[Placement, ...]:
        return self.placements.get(role, self.placements.get("*", ()))


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "cpu",
            "x86/ARM CPU: ExecuTorch XNNPACK .pte and ONNX Runtime .onnx for every component",
            {"*": (Placement("executorch", ("fp32", "fp16")), Placement("onnx", ("fp32", "fp16")))},
            {"cpu": "any", "runtimes": ["executorch (xnnpack)", "onnxruntime (cpu)"]},
        ),
        Target(
            "mnn",
            "Android/ARM CPU through MNN: every component as .mnn",
            {"*": (Placement("mnn", ("fp32", "fp16")),)},
            {"cpu": "arm64 (MNN CPU backend)", "runtimes": ["mnn (cpu)"]},
        ),
        Target(
            "llama-cpp",
            "llama.cpp (CPU/GPU on any device): language-model components as .gguf",
            {"talker": (Placement("gguf", ("f16", "q8_0", "q4_0")),)},
            {
                "runtimes": ["llama.cpp (libllama, cpu)"],
                "not_placed": {
                    "predictor": "llama.cpp runs the code predictor only inside libmtmd, from an mmproj GGUF that must "
                                 "also hold a speaker encoder (mtmd refuses a file without an input encoder); "
                                 "edgex's components have no speaker encoder, and libmtmd exposes no predictor "
                                 "logits to measure",
                    "decoder": "llama.cpp's code2wav (libmtmd) hard-codes the real decoder's sizes (8 layers, "
                               "16 heads) and is not exposed as a graph with the component's inputs",
                },
            },
        ),
    )
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise EdgexError(f"no such target {name!r} (known: {', '.join(TARGETS)})") from None
