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

    def to_json(self) -> dict:
        return {k: v for k, v in (("device", self.device), ("unverified", self.unverified), ("calibration", self.calibration),
                                  ("compute_unit", self.compute_unit)) if v}


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    placements: dict[str, tuple[Placement, ...]]  # role -> placements; "*" for any other role
    facts: dict = field(default_factory=dict)
    # exporter name -> keyword options the target passes to that exporter (e.g. the SoC to build for)
    exporter_options: dict[str, dict] = field(default_factory=dict)
    overridden: frozenset = frozenset()  # keys placed by the user (`with_overrides`)

    def placements_for(self, role: str, component: str | None = None, fp32: bool = False) -> tuple[Placement, ...]:
        """A component's own placement (`--placement talker_decode=...`), else its role's, else "*".
        `fp32`: the recipe declares the component fp32-only (`RecipeFacts.fp32_components`); where
        that placement builds no fp32, the target's "fp32" placement serves (reason in its facts'
        `fp32_placement`), unless the user placed the component or role."""
        key = component if component is not None and component in self.placements else role
        placed = self.placements.get(key, self.placements.get("*", ()))
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
        same = next((p for p in self.placements_for(role) if p.exporter == new.exporter), None)
        return replace(same, precisions=new.precisions, calibration=new.calibration) if same else new


# Roles of the VLA policy recipes (act, diffusion-policy, smolvla): camera image -> tokens or
# features (`vision`), image + language + state tokens -> per-layer K/V (`prefix`), and everything
# that produces actions (`action`: ACT's one-pass policy, a denoise / velocity step, the whole loop).
# Each target places them by name or says in `not_placed` why not.
VLA_ROLES = ("vision", "prefix", "action")
_CPU = (Placement("executorch", ("fp32", "fp16")), Placement("onnx", ("fp32", "fp16")))
_MNN = (Placement("mnn", ("fp32", "fp16")),)
# MiniCPM-o's HiFT (components `hift` and `hift_stream`, role decoder) is placed by name in fp32 only: rounding its
# weights to fp16 alone scores 5.8 dB (tiny; ONNX fp16 4.8 dB, MNN -2.4 dB) against a 30 dB gate,
# while its fp32 graph holds 73.7 dB. `-p fp16` still builds the fp16 variant on request.
HIFT = ("hift", "hift_stream")
HIFT_FP32 = dict.fromkeys(HIFT, "fp32 only: fp16 weights alone move the vocoder's F0 and so the phase of its sine source "
                                "(tiny: fp16 scheme 5.8 dB, ONNX fp16 4.8 dB, MNN fp16 -2.4 dB against a 30 dB gate; fp32 73.7 dB)")

def _htp(name: str, phone: str, soc: str, soc_model: int, arch: int) -> Target:
    """A Snapdragon phone: LM roles on the Hexagon NPU, Code2Wav on the Adreno GPU (measured best on the S25)."""
    htp = f"Hexagon v{arch} HTP"
    npu = (Placement("qnn", ("fp16",), device=htp, compute_unit="npu"),)
    gpu = (Placement(
        "onnx", ("fp32",), device="Adreno GPU (QNN GPU backend)",
        unverified="execution on the Adreno GPU: parity ran this ONNX graph in fp32 on ONNX Runtime CPU, not the GPU kernels "
                   "(--hub runs it on the device's GPU)",
        compute_unit="gpu",
    ),)
    # VLA policies (docs/models.md): every graph on the NPU in fp16 and in w8a16 calibrated on
    # observations from the eager policy; the Euler / DDIM loop too (the HTP has no fp32 path).
    vla = (Placement("qnn", ("fp16", "w8a16"), device=htp, compute_unit="npu"),)
    # A flow step's own time embedding (sin / cos of 2 pi t / period, periods from 4e-3) is lost in
    # fp16 arithmetic (`action_step_placement`): that component alone defaults to w8a16.
    step = (Placement("qnn", ("w8a16",), device=htp, compute_unit="npu"),)
    # Components a recipe declares fp32-only: the HTP has no fp32 path, the phone's CPU has.
    cpu = (Placement("onnx", ("fp32",), device="Kryo CPU (ONNX Runtime)", compute_unit="cpu"),)
    # MiniCPM-o's TTS head in fp16 and in w8a16 calibrated on eager head states (tiny: prefill 49.9 / 24.9 dB,
    # decode 51.7 / 28.4 dB in the HTP simulator).
    head = (Placement("qnn", ("fp16", "w8a16"), device=htp, compute_unit="npu"),)
    return Target(
        name,
        f"{phone} ({soc}, Hexagon v{arch}): talker + predictor as HTP context binaries, Code2Wav ONNX for the GPU",
        {"talker": npu, "predictor": npu, "llm": npu, "decoder": gpu, **dict.fromkeys(VLA_ROLES, vla), "action_step": step,
         **dict.fromkeys(("tts_prefill", "tts_decode"), head), "fp32": cpu, "*": npu},
        {"device": phone, "soc": soc, "soc_model": soc_model, "htp_arch": f"v{arch}", "hub_device": f"{phone} (Family)",
         # MiniCPM-o's Token2wav (flow DiT + HiFT) has role decoder too and follows Code2Wav to the GPU.
         "decoder_placement": "Code2Wav (qwen3-tts) measured best on the Adreno GPU; Token2wav (minicpm-o) is placed "
                              "with it unmeasured: its DiT is 91 % of its CPU cost and HTP fp16 vs GPU timing on a "
                              "device is still to be done (--placement decoder=qnn:fp16 builds the HTP variant)",
         "action_step_placement": "a flow VLA's action_step (SmolVLA) computes the sin / cos embedding of its time input "
                                  "t (periods 4e-3 .. 4, phases up to 1571 t rad): in the HTP's fp16 the phase is off "
                                  "by up to ~0.8 rad and the embedding alone scores 19-34 dB, the velocity 29.6 dB "
                                  "(tiny, below the 30 dB fp16 lowering gate). It is built in w8a16 (16-bit "
                                  "activations resolve t); action_loop, whose times are fixed, bakes the embeddings "
                                  "and runs fp16 (--placement action_step=qnn:fp16 builds the fp16 variant)",
         "fp32_placement": "a component its recipe declares fp32-only (pi0's action_step and action_loop: its "
                           "recipe's fp32_components) runs as ONNX fp32 on the CPU, as the HTP computes in fp16 or "
                           "quantized only (--placement action_loop=qnn:fp16 builds the HTP variant)"},
        {"qnn": {"soc_model": soc_model, "htp_arch": arch}},
    )


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            "cpu",
            "x86/ARM CPU: ExecuTorch XNNPACK .pte and ONNX Runtime .onnx for every component",
            {**dict.fromkeys(VLA_ROLES, _CPU), "*": _CPU,
             **dict.fromkeys(HIFT, (Placement("executorch", ("fp32",)), Placement("onnx", ("fp32",))))},
            {"cpu": "any", "runtimes": ["executorch (xnnpack)", "onnxruntime (cpu)"], "precision_limits": HIFT_FP32},
        ),
        Target(
            "mnn",
            "Android/ARM CPU through MNN: every component as .mnn",
            {**dict.fromkeys(VLA_ROLES, _MNN), "action_step": (Placement("mnn", ("fp32",)),),
             **dict.fromkeys(HIFT, (Placement("mnn", ("fp32",)),)), "*": _MNN},
            {"cpu": "arm64 (MNN CPU backend)", "runtimes": ["mnn (cpu)"], "precision_limits": HIFT_FP32,
             "action_step_placement": "a flow VLA's action_step (SmolVLA) scored 18.2 dB in MNN fp16 (lowering; torch "
                                      "fp16 61.6, the same graph's loop with baked time embeddings 65.3): its time "
                                      "frequencies (up to 2 pi / 0.004 = 1571 rad) stored in fp16 are the likely cause, "
                                      "not isolated further. Built in fp32 (--placement action_step=mnn:fp16 builds fp16)"},
        ),
        # SoC model numbers and HTP architectures as QAIRT names them.
        _htp("s25-htp", "Samsung Galaxy S25", "SM8750 Snapdragon 8 Elite for Galaxy", 69, 79),
        _htp("s24-htp", "Samsung Galaxy S24", "SM8650 Snapdragon 8 Gen 3", 57, 75),
        _htp("s23-htp", "Samsung Galaxy S23", "SM8550 Snapdragon 8 Gen 2", 43, 73),
        Target(
            "llama-cpp",
            "llama.cpp (CPU/GPU on any device): language-model components as .gguf",
            # Spark-X2.5's q4_0 scores 7-9 dB on the tiny preset (below its 8 dB gate; docs/models.md: 4-bit
            # weights without calibration break it on device too): on request only (`-p q4_0`). Schemes
            # too coarse for one component are its recipe's declaration (`RecipeFacts.coarse`).
            {"talker": (Placement("gguf", ("f16", "q8_0", "q4_0")),), "llm": (Placement("gguf", ("f16", "q8_0")),)},
            {
                "runtimes": ["llama.cpp (libllama, cpu)"],
                "not_placed": {
                    "predictor": "llama.cpp runs the code predictor only inside libmtmd, from an mmproj GGUF that must "
                                 "also hold a speaker encoder (mtmd refuses a file without an input encoder); "
                                 "edgex's components have no speaker encoder, and libmtmd exposes no predictor "
                                 "logits to measure",
                    "decoder": "llama.cpp's code2wav (libmtmd) hard-codes the real decoder's sizes (8 layers, "
                               "16 heads) and is not exposed as a graph with the component's inputs; it has no "
                               "flow-matching DiT or HiFT graph for MiniCPM-o's Token2wav",
                    **dict.fromkeys(VLA_ROLES, "llama.cpp has no robot-policy architecture: no vision encoder "
                                    "outside libmtmd's LLM projectors, no cross-attending action expert, no "
                                    "denoising loop; export VLA policies to cpu, mnn, s25-htp or apple"),
                },
            },
        ),
        Target(
            "apple",
            "iPhone / Mac (Apple Neural Engine) through Core ML: every component as an .mlpackage ML program",
            {
                "*": (Placement("coreml", ("fp16", "w8", "w4")),),
                "decoder": (Placement("coreml", ("fp32", "fp16", "w8", "w4")),),
                # VLA: vision and prefix fp16 / w8 on the Neural Engine; the action graphs keep an
                # fp32 build beside fp16 (docs/models.md: an fp16 pi0 denoise loop scored cosine -0.55).
                "vision": (Placement("coreml", ("fp16", "w8")),),
                "prefix": (Placement("coreml", ("fp16", "w8")),),
                "action": (Placement("coreml", ("fp32", "fp16")),),
                "action_step": (Placement("coreml", ("fp32",)),),
                **dict.fromkeys(HIFT, (Placement("coreml", ("fp32",)),)),
            },
            {
                "soc": "Apple A17 Pro / M-series (Neural Engine, GPU, CPU)",
                "minimum_deployment_target": "iOS18 / macOS15",
                # The LM graphs run fp16 on the Neural Engine. The decoder's conv stack is the least
                # fp16-tolerant graph (lowest fp16 dB on every format): it keeps an fp32 build for
                # the GPU beside the fp16 one, until on-device timing picks between them.
                "compute_units": {"talker": "CPU_AND_NE", "predictor": "CPU_AND_NE", "decoder": "CPU_AND_GPU",
                                  "vision": "CPU_AND_NE", "prefix": "CPU_AND_NE", "action": "CPU_AND_GPU"},
                "runtimes": ["coreml (macOS prediction)", "edgex-mil-interpreter (elsewhere)"],
                "action_step_placement": "a flow VLA's action_step (SmolVLA) scored 29.2 dB in Core ML fp16 (lowering 29.3, "
                                         "scheme 61.6; tiny, MIL interpreter) against the 30 dB gate: its sin / cos time "
                                         "embedding of t in fp16, as on the HTP and MNN. Built in fp32 (103.5 dB); "
                                         "--placement action_step=coreml:fp16 builds fp16",
                "precision_limits": HIFT_FP32,
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
                         "component), e.g. decoder=qnn:fp16 or talker_decode=qnn:w8a16:16")
    return key.strip(), Placement(parts[0].strip(), (parts[1].strip(),), calibration=calibration)
