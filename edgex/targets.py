"""Device profiles: which format, backend and precisions each component role gets."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from .errors import EdgexError


@dataclass(frozen=True)
class Placement:
    exporter: str  # registered exporter name
    precisions: tuple[str, ...]  # default precisions for this role on this target
    # Where the artifact runs on the device, when that is not what the exporter's runtime checks
    # here, and what local parity therefore does not cover. Both go into the manifest.
    device: str | None = None
    unverified: str | None = None
    # Calibration input sets for a calibrated scheme placed here (`ROLE=EXPORTER:PRECISION:N`, what
    # `edgex sweep` recommends); None: the command's --calibration, else the component's own default.
    calibration: int | None = None
    # Placed by the user (`--placement`), not by the target: its precisions are asked for by name,
    # so a precision the recipe declares too coarse for a component is built (with a warning).
    requested: bool = False
    # The processor it runs on there ("npu", "gpu", "cpu"): what `--hub` compiles and runs it for on
    # the AI Hub device (`edgex.hub.artifacts`). None: what the exporter's runtime runs it on here.
    compute_unit: str | None = None
    # Why these precisions and not the role's: the recipe's declaration for the component
    # (`RecipeFacts.placed_precisions`), with its measured figures.
    recipe_precisions: str | None = None
    # Placed only where the recipe declares the component's file for this exporter
    # (`RecipeFacts.declared_files`): a runtime that runs fixed graphs of some models only
    # (libmtmd's speech generation). Elsewhere the component is not placed, with the reason.
    declared_only: bool = False

    def to_json(self) -> dict:
        return {k: v for k, v in (("device", self.device), ("unverified", self.unverified), ("calibration", self.calibration),
                                  ("compute_unit", self.compute_unit), ("recipe_precisions", self.recipe_precisions)) if v}


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    # role -> placements (every role of ROLES, or its reason in facts["not_placed"]); "fp32": where a
    # component its recipe declares fp32-only goes when its role's placement builds no fp32
    placements: dict[str, tuple[Placement, ...]]
    facts: dict = field(default_factory=dict)
    # exporter name -> keyword options the target passes to that exporter (e.g. the SoC to build for)
    exporter_options: dict[str, dict] = field(default_factory=dict)
    overridden: frozenset = frozenset()  # keys placed by the user (`with_overrides`)

    def placements_for(self, role: str, component: str | None = None, fp32: bool = False, own=None) -> tuple[Placement, ...]:
        """A component's own placement (`--placement COMPONENT=...`), else its role's. A role the
        target neither places nor declines (`not_placed`) is a one-line error: a recipe that brings a
        new role declares the known role it is placed like (`RecipeFacts.placed_like`).
        `own`: the precisions the recipe declares for the component (`RecipeFacts.placed_precisions`),
        applied unless the user placed the component or its role.
        `fp32`: the recipe declares the component fp32-only (`RecipeFacts.fp32_components`); where
        that placement builds no fp32, the target's "fp32" placement serves (reason in its facts'
        `fp32_placement`), unless the user placed the component or role."""
        key = component if component is not None and component in self.placements else role
        if key not in self.placements:
            if key in self.facts.get("not_placed", {}):
                return ()
            raise EdgexError(f"target {self.name} does not place role {key!r} (roles it places: "
                             f"{', '.join(r for r in self.placements if r != 'fp32')}): a recipe that introduces a role "
                             "declares the known role it is placed like (RecipeFacts.placed_like)")
        placed = self.placements[key]
        if own is not None and key not in self.overridden:
            placed = tuple(replace(p, precisions=own.on(p.exporter), recipe_precisions=own.reason)
                           if own.on(p.exporter) is not None else p for p in placed)
        if fp32 and key not in self.overridden and "fp32" in self.placements and not any("fp32" in p.precisions for p in placed):
            return self.placements["fp32"]
        return placed

    def with_overrides(self, overrides: dict[str, tuple[Placement, ...]], roles: dict[str, str] | None = None) -> "Target":
        """This target with some roles or components placed elsewhere (`--placement KEY=EXPORTER:PRECISION`,
        one or more per key). An override on an exporter the target already places there keeps that
        placement's device facts (where it runs, what parity here misses); `roles` maps component
        names to their roles."""
        placed = {}
        for key, news in overrides.items():
            role = (roles or {}).get(key, key)
            placed[key] = tuple(replace(self._keeping_facts(role, new), requested=True) for new in news)
        return replace(self, placements={**self.placements, **placed}, overridden=self.overridden | set(placed))

    def _keeping_facts(self, role: str, new: Placement) -> Placement:
        same = next((p for p in self.placements.get(role, ()) if p.exporter == new.exporter), None)
        return replace(same, precisions=new.precisions, calibration=new.calibration) if same else new


# The roles every target places or declines with a reason (`not_placed`): a language model's
# prompt / per-token graphs (`llm`), a speech model's token generator (`talker`) and its per-frame
# code generator (`predictor`), any waveform decoder (`decoder`); and a robot policy's camera image
# -> tokens or features (`vision`), image + language + state tokens -> per-layer K/V (`prefix`), and
# everything that produces actions (`action`: a one-pass policy, a denoise / velocity step, a loop).
LM_ROLES = ("talker", "predictor", "llm")
VLA_ROLES = ("vision", "prefix", "action")
ROLES = (*LM_ROLES, "decoder", *VLA_ROLES)
_CPU = (Placement("executorch", ("fp32", "fp16")), Placement("onnx", ("fp32", "fp16")))
_MNN = (Placement("mnn", ("fp32", "fp16")),)


def _htp(name: str, phone: str, soc: str, soc_model: int, arch: int) -> Target:
    """A Snapdragon phone: LM roles on the Hexagon NPU, decoders on the Adreno GPU (measured best there)."""
    htp = f"Hexagon v{arch} HTP"
    npu = (Placement("qnn", ("fp16",), device=htp, compute_unit="npu"),)
    gpu = (Placement(
        "onnx", ("fp32",), device="Adreno GPU (QNN GPU backend)",
        unverified="execution on the Adreno GPU: parity ran this ONNX graph in fp32 on ONNX Runtime CPU, not the GPU kernels "
                   "(--hub runs it on the device's GPU)",
        compute_unit="gpu",
    ),)
    # Robot policies: every graph on the NPU in fp16 and in w8a16 calibrated on observations from
    # the eager policy; the Euler / DDIM loop too (the HTP has no fp32 path).
    vla = (Placement("qnn", ("fp16", "w8a16"), device=htp, compute_unit="npu"),)
    # Components a recipe declares fp32-only: the HTP has no fp32 path, the phone's CPU has.
    cpu = (Placement("onnx", ("fp32",), device="Kryo CPU (ONNX Runtime)", compute_unit="cpu"),)
    return Target(
        name,
        f"{phone} ({soc}, Hexagon v{arch}): language-model roles as HTP context binaries, decoders as ONNX for the GPU",
        {**dict.fromkeys(LM_ROLES, npu), "decoder": gpu, **dict.fromkeys(VLA_ROLES, vla), "fp32": cpu},
        {"device": phone, "soc": soc, "soc_model": soc_model, "htp_arch": f"v{arch}", "hub_device": f"{phone} (Family)",
         "decoder_placement": "a streaming vocoder measured fastest on the Adreno GPU; every decoder is placed there "
                              "(--placement decoder=qnn:fp16 builds the HTP variant)",
         "fp32_placement": "a component its recipe declares fp32-only (its recipe's fp32_components) runs as ONNX fp32 on "
                           "the CPU, as the HTP computes in fp16 or quantized only (--placement COMPONENT=qnn:fp16 "
                           "builds the HTP variant)"},
        {"qnn": {"soc_model": soc_model, "htp_arch": arch}},
    )


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "cpu",
            "x86/ARM CPU: ExecuTorch XNNPACK .pte and ONNX Runtime .onnx for every component",
            dict.fromkeys(ROLES, _CPU),
            {"cpu": "any", "runtimes": ["executorch (xnnpack)", "onnxruntime (cpu)"]},
        ),
        Target(
            "mnn",
            "Android/ARM CPU through MNN: every component as .mnn",
            dict.fromkeys(ROLES, _MNN),
            {"cpu": "arm64 (MNN CPU backend)", "runtimes": ["mnn (cpu)"]},
        ),
        # SoC model numbers and HTP architectures as QAIRT names them.
        _htp("s25-htp", "Samsung Galaxy S25", "SM8750 Snapdragon 8 Elite for Galaxy", 69, 79),
        _htp("s24-htp", "Samsung Galaxy S24", "SM8650 Snapdragon 8 Gen 3", 57, 75),
        _htp("s23-htp", "Samsung Galaxy S23", "SM8550 Snapdragon 8 Gen 2", 43, 73),
        Target(
            "llama-cpp",
            "llama.cpp (CPU/GPU on any device): language-model components as .gguf",
            # Schemes too coarse for one component are its recipe's declaration (`RecipeFacts.coarse`).
            # A speech model's code predictor and decoder run in libmtmd from an "mmproj" GGUF, as
            # llama.cpp's converter writes it, for the models libmtmd has graphs for (the recipe
            # declares the file: `RecipeFacts.declared_files`); the precisions its converter offers.
            {"talker": (Placement("gguf", ("f16", "q8_0", "q4_0")),), "llm": (Placement("gguf", ("f16", "q8_0")),),
             **dict.fromkeys(("predictor", "decoder"), (Placement("gguf", ("f32", "f16", "q8_0"), declared_only=True),))},
            {
                "runtimes": ["llama.cpp (libllama, cpu)", "llama.cpp (libmtmd speech generation, cpu)"],
                "declared_only": {
                    "predictor": "llama.cpp runs a speech model's code predictor only as libmtmd's fixed graph for "
                                 "that model, from an mmproj GGUF the recipe declares",
                    "decoder": "llama.cpp runs a speech decoder only as libmtmd's fixed graph for that model (at fixed "
                               "sizes), from an mmproj GGUF the recipe declares; it has no flow-matching or "
                               "neural-vocoder decoder graph",
                },
                "not_placed": {
                    **dict.fromkeys(VLA_ROLES, "llama.cpp has no robot-policy architecture: no vision encoder "
                                    "outside libmtmd's LLM projectors, no cross-attending action expert, no "
                                    "denoising loop; export robot policies to cpu, mnn, s25-htp or apple"),
                },
            },
        ),
        Target(
            "apple",
            "iPhone / Mac (Apple Neural Engine) through Core ML: every component as an .mlpackage ML program",
            {
                **dict.fromkeys(LM_ROLES, (Placement("coreml", ("fp16", "w8", "w4")),)),
                "decoder": (Placement("coreml", ("fp32", "fp16", "w8", "w4")),),
                # Robot policies: vision and prefix fp16 / w8 on the Neural Engine; the action graphs
                # keep an fp32 build beside fp16 (docs/models.md: an fp16 flow-matching denoise loop
                # scored cosine -0.55).
                "vision": (Placement("coreml", ("fp16", "w8")),),
                "prefix": (Placement("coreml", ("fp16", "w8")),),
                "action": (Placement("coreml", ("fp32", "fp16")),),
            },
            {
                "soc": "Apple A17 Pro / M-series (Neural Engine, GPU, CPU)",
                "minimum_deployment_target": "iOS18 / macOS15",
                # The LM graphs run fp16 on the Neural Engine. The decoder's conv stack is the least
                # fp16-tolerant graph (lowest fp16 dB on every format): it keeps an fp32 build for
                # the GPU beside the fp16 one, until on-device timing picks between them.
                "compute_units": {"talker": "CPU_AND_NE", "predictor": "CPU_AND_NE", "llm": "CPU_AND_NE",
                                  "decoder": "CPU_AND_GPU", "vision": "CPU_AND_NE", "prefix": "CPU_AND_NE",
                                  "action": "CPU_AND_GPU"},
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


def parse_placement(text: str) -> tuple[str, Placement]:
    """`KEY=exporter:precision[:calibration]` -> (KEY, Placement), KEY a role or a component; names
    are checked by the planner."""
    key, sep, rest = text.partition("=")
    parts = rest.split(":")
    calibration = None
    if len(parts) == 3 and parts[2].isdigit() and int(parts[2]) > 0:
        calibration = int(parts.pop())
    if not (sep and key and len(parts) == 2 and all(parts)):
        raise EdgexError(f"bad --placement {text!r}: expected ROLE=EXPORTER:PRECISION[:CALIBRATION] (ROLE may be a "
                         "component), e.g. decoder=qnn:fp16 or talker=qnn:w8a16:16")
    return key.strip(), Placement(parts[0].strip(), (parts[1].strip(),), calibration=calibration)
