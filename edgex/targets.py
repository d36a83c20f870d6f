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
            "apple",
            "iPhone / Mac (Apple Neural Engine) through Core ML: every component as an .mlpackage ML program",
            {
                "*": (Placement("coreml", ("fp16", "w8", "w4")),),
                "decoder": (Placement("coreml", ("fp32", "fp16", "w8", "w4")),),
            },
            {
                "soc": "Apple A17 Pro / M-series (Neural Engine, GPU, CPU)",
                "minimum_deployment_target": "iOS18 / macOS15",
                # The LM graphs run fp16 on the Neural Engine. The decoder's conv stack is the least
                # fp16-tolerant graph (lowest fp16 dB on every format): it keeps an fp32 build for
                # the GPU beside the fp16 one, until on-device timing picks between them.
                "compute_units": {"talker": "CPU_AND_NE", "predictor": "CPU_AND_NE", "decoder": "CPU_AND_GPU"},
                "runtimes": ["coreml (macOS prediction)", "edgex-mil-interpreter (elsewhere)"],
            },
        ),
    )
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise EdgexError(f"no such target {name!r} (known: {', '.join(TARGETS)})") from None
