"""Parity gates: the minimum SNR (dB) an artifact must reach, per (role, precision).

Defaults are per precision, from measurements on the tiny and 0.6b presets (docs/parity.md,
"Gates"): fp32 graphs differ from eager only by kernel rounding (> 100 dB measured), fp16 by
half-precision rounding, int schemes by quantization noise. No role has measured differently
enough to need its own default, so there is no per-role table: a per-(role, precision) gate is an
override (`--min-db decoder:fp16=40`), recorded in the manifest (`gate_overrides`) and looked up
here the same way at export and at `edgex verify`.

Every artifact's end-to-end figure (artifact vs fp32 eager) must reach `DEFAULT_DB`: the floor a
user of the artifact gets, the same promise at every precision. Quantized and fp16 artifacts get
two more gates (`edgex.parity.scheme`). `DEFAULT_DB` is also their *scheme* gate, a policy on the
scheme reference against fp32 eager: the eager model's own code with the quantized weights the file
stores (for QNN's static QDQ schemes, the integers, scales and zero points of the QDQ graph the
binary was compiled from, with each linear layer's input fake-quantized at the graph's recorded
scale); no exported graph runs there, so a broken lowering cannot score on the reference's side,
and every stored quantized tensor is also scored against an independent quantizer
(`edgex.parity.quantized`). Scheme and lowering errors add, so both passing does not make the
artifact pass its floor (docs/parity.md, "The end-to-end floor"). `LOWERING_DB` gates the artifact against
that quantized eager model, where only the lowering (and the format's compute precision) differ:
it is tight, far above the 0-6 dB broken graphs score, so a lowering bug fails even where the
scheme itself is noisy (4-bit weights on random presets score ~20 dB, a broken graph would pass
the old 5 dB gate).

A flipped token is judged apart from the gate: a sampled token or a logits top-1 that differs
from the reference passes only as a near-tie of the reference's own scores, within the score
difference an error at `TIE_DB` (or at the gate, where it is stricter) can make
(`tie_db`, `edgex.parity.check.tie_margin`). The margin never widens with a loose gate: at a 5 dB
policy gate it would be 1.12 x rms(logits), and nearly any flip would pass as a tie.
"""

from __future__ import annotations

import math

from ..errors import EdgexError

DEFAULT_DB = {"fp32": 60.0, "fp16": 30.0, "8da8w": 15.0, "8da4w": 5.0, "w8": 20.0, "w4": 5.0,
              # GGUF (llama.cpp computes in fp32 on F16 / block-quantized weights, F16 KV cache)
              # f32: libmtmd's Code2Wav on an all-F32 file reaches 57.5 dB spectral / 54.7 dB waveform
              # against eager on the tiny preset (neither ggml's GELU table nor its depthwise conv's
              # F16 im2col, each modelled in eager, moves it): llama.cpp's own fp32 arithmetic
              "f32": 45.0, "f16": 30.0, "q8_0": 25.0, "q4_0": 8.0,
              # HTP static QDQ, calibrated: a policy on the scheme reference (eager model with the
              # QDQ graph's weights and linear-input scales; the graph is not run) vs fp32. The
              # figures were measured with the QDQ graph run on ONNX Runtime CPU as the reference, on
              # tiny presets: w8a16 14-32 dB, w8a8 -1-21 dB (the predictor step and Spark-X2.5
              # fail), w4a16 12-14 dB on qwen3-tts, 3-4 dB on Spark-X2.5 (fails) (docs/models.md: uncalibrated w4a16 -1.6 dB on a real model)
              "w8a16": 10.0, "w8a8": 8.0, "w4a16": 8.0}


# Artifact vs its scheme reference, tiny preset (docs/parity.md, "Scheme vs lowering, every
# component"; scripts/scheme_table.py): fp32-compute runtimes reproduce the scheme to 30-136 dB
# (ExecuTorch 8da8w / 8da4w, MNN on the talker / predictor: >126 dB, the scheme modelled exactly;
# ExecuTorch 8da4w on Spark-X2.5's decode 36.5 dB; llama.cpp, which also rounds activations to 8
# bits in its dot products and keeps an F16 KV cache, 30-44 dB); fp16 arithmetic (Core ML's
# compressed programs, fp16 files) 50-67 dB.
# Broken lowerings measured: ExecuTorch w8 -52 dB, a llama.cpp RoPE base 40 % off 17 dB, broken
# graphs in general 0-6 dB. 30 dB sits under the noisiest faithful lowering of those.
# Static QDQ (w8a16 / w8a8 / w4a16): the reference is the eager model with the QDQ graph's weights
# and linear-input scales (the graph is not run), so the lowering figure also holds the graph's other
# activation quantization. Faithful w8a16 HTP binaries against it, tiny, s25-htp
# (scripts/scheme_table.py -s qnn:w8a16, benchmarks/bench_planted_graph.py): smolvla prefix 14.6 dB,
# code_predictor_step 16.7, talker_decode 18.1, diffusion-policy action_loop 18.7, Spark-X2.5 decode 20.5,
# code_predictor 20.7, smolvla action_loop 26.6, minicpm-o tts_decode 31.4, talker_prefill 34.4, act
# policy 35.0. Broken: a binary compiled with one weight scale x4 -6 dB; graph bugs planted at w8a16
# 0.7-7.5 dB (a skipped denoising step or unnormalization in Diffusion Policy's loop, a dropped head
# in minicpm-o's TTS decode), but 15.2 (a dropped head in ACT), 15.3 (in SmolVLA's prefix) and 18.8
# (one Euler step of SmolVLA's loop zeroed): there the faithful and broken figures overlap, and other
# figures fail the bugs (`ACTION_ERROR`; the fp32 graph the QDQ graph was made from, gated at 60 dB
# against eager). The HTP's lowering of asymmetric int4 weights (w4a16)
# scored 3.7 dB against this reference; int4 weights are quantized symmetric (17.8 dB). 12 dB: 2.6 dB under the lowest faithful figure, above
# every broken figure the lowering alone can separate; raising it into the overlap would fail
# faithful graphs before it failed those bugs.
LOWERING_DB = {p: 30.0 for p in ("fp16", "8da8w", "8da4w", "w8", "w4", "f32", "f16", "q8_0", "q4_0")}
LOWERING_DB |= {p: 12.0 for p in ("w8a16", "w8a8", "w4a16")}
LOWERING = "lowering"  # `--min-db lowering=DB` / `--min-db lowering:PRECISION=DB`

# fp16 artifacts on a runtime whose matrix products accumulate in fp16 (`Runtime.accumulates_in_half`,
# `edgex.parity.half_arithmetic`): the floor is the component's module in fp16 with fp16 accumulation
# against itself in fp32. On the tiny presets and a Spark-X2.5 decode at hidden 1024 (XNNPACK on
# AVX512-FP16), the faithful `.pte` scored 3.3 dB under its floor at worst (act policy: floor 54.2,
# artifact 50.9 dB; the wide decode: floor 29.0, artifact 29.4 dB). The fp16 gates then sit
# `HALF_ARITHMETIC_ALLOWANCE_DB` under the floor where the floor is within reach of them, never under
# `HALF_ARITHMETIC_MIN_DB`: planted graph bugs score 7-20 dB at fp16, and a component whose fp16
# arithmetic alone comes that close to them fails, fp16 being too coarse for it on that runtime.
HALF_ARITHMETIC_ALLOWANCE_DB = 6.0
HALF_ARITHMETIC_MIN_DB = 22.0


def half_arithmetic_db(gate_db: float, floor_db: float) -> float:
    """A fixed fp16 gate on a runtime that accumulates in fp16, given the component's floor there."""
    return min(gate_db, max(HALF_ARITHMETIC_MIN_DB, floor_db - HALF_ARITHMETIC_ALLOWANCE_DB))


def overridden(role: str, precision: str, overrides: dict[str, float] | None, lowering: bool = False) -> bool:
    """Whether the user set this gate (`threshold_db`'s keys, or `lowering_db`'s with `lowering`)."""
    keys = (f"{LOWERING}:{precision}", LOWERING) if lowering else (f"{role}:{precision}", role, precision, "*")
    return any(k in (overrides or {}) for k in keys)


# The noise level whose score difference makes a tie: an error at 30 dB has rms 0.032 x rms(logits),
# and a flip moves two scores, so the tie margin is 0.063 x rms(logits). 30 dB is the fp16 and
# fp32-compute lowering gate (a faithful graph's rounding, `LOWERING_DB`); a scheme whose noise flips
# tokens by more than that is too coarse for the component, whatever its SNR gate says.
TIE_DB = 30.0

# The action error (`metrics.action_error`: a policy's unnormalized actions, per dimension, RMS over
# the chunk in units of that dimension's spread) an artifact may reach against its reference, at
# every precision: the task figure of VLA action graphs, whose SNR gates a wrong dimension or a
# skipped denoising step can pass. Measured on the tiny SmolVLA action_loop (4 Euler steps,
# benchmarks/bench_planted_graph.py): faithful fp16 builds 0.002-0.005, QNN w8a16 0.193 (scheme
# 0.039); one Euler step's velocity zeroed 0.28 at every fp16 build and 0.297 at QNN w8a16, where
# its SNRs (18.8 dB end to end and lowering) pass the 10 / 12 dB gates: only this figure fails it.
ACTION_ERROR = 0.25

# The lowest correlation (`metrics.cosine`) a waveform output gated by its spectral figure
# (`Component.spectral`) may have with its reference, at every precision. The spectral figure is
# blind to phase by design, so it scores a negated waveform, or one turned or shifted by part of a
# period, as (nearly) identical; a sign flip in a graph is a graph bug, whatever the ear says. A
# negated waveform correlates at -1, a quarter-period turn near 0, a 60 degree turn at 0.5 (0 dB
# waveform SNR); additive noise that passes the spectral gate stays above 0.7 (0 dB SNR: 0.71).
# Faithful vocoders, tiny presets: MiniCPM-o HiFT fp32 1 - 5.5e-8 at worst, Qwen3-TTS decoders fp16
# 1 - 3.1e-6, Core ML w4 (placed by default on `apple`, 6.0 dB waveform SNR) 0.878 at worst
# (docs/parity.md, "Waveforms correlated with the reference").
WAVEFORM_CORRELATION = 0.5


def tie_db(gate_db: float) -> float:
    """The level whose tie margin judges a flip under a gate: the gate where it is stricter than
    `TIE_DB` (fp32's 60 dB), else `TIE_DB`; never a looser gate's."""
    return max(gate_db, TIE_DB)


def end_to_end_tie_db(gate_db: float) -> float:
    """The tie level of an end-to-end figure that holds two errors, the scheme's and the lowering's,
    each judged at `tie_db` in its own figure: their noise powers add, 3 dB below either. A faithful
    8-bit file otherwise fails on the sum of two tie-level errors: Spark-X2.5 prefill GGUF q8_0
    (tiny) flips at 1.07 x the 30 dB tie margin end to end while its scheme (0.15 x) and lowering
    (0.65 x) flips are ties; the 4-bit schemes declared too coarse flip at 5-33 x."""
    return tie_db(gate_db) - 10.0 * math.log10(2.0)


def lowering_db(precision: str, overrides: dict[str, float] | None = None) -> float:
    """The lowering gate: an override (`lowering:PRECISION`, then `lowering`), else the default."""
    overrides = overrides or {}
    for key in (f"{LOWERING}:{precision}", LOWERING):
        if key in overrides:
            return overrides[key]
    if precision not in LOWERING_DB:
        raise EdgexError(f"precision {precision!r} has no lowering gate: give one with --min-db {LOWERING}:{precision}=DB")
    return LOWERING_DB[precision]


def parse_overrides(values: list[str] | None) -> dict[str, float]:
    """`--min-db 30` (every artifact), `--min-db decoder=40` / `--min-db fp16=25` (role or
    precision) or `--min-db decoder:fp16=40` (both); `--min-db lowering=35` or
    `--min-db lowering:q4_0=35` for the lowering gate of quantized artifacts."""
    overrides: dict[str, float] = {}
    for value in values or []:
        key, _, number = value.rpartition("=")
        try:
            overrides[key or "*"] = float(number)
        except ValueError:
            raise EdgexError(f"bad --min-db {value!r}: expected DB, ROLE=DB, PRECISION=DB or ROLE:PRECISION=DB") from None
    return overrides


def threshold_db(role: str, precision: str, overrides: dict[str, float] | None = None) -> float:
    """The most specific override (role:precision, role, precision, every artifact), else the
    precision's default."""
    overrides = overrides or {}
    for key in (f"{role}:{precision}", role, precision, "*"):
        if key in overrides:
            return overrides[key]
    if precision not in DEFAULT_DB:
        raise EdgexError(f"precision {precision!r} has no default gate: give one with --min-db {precision}=DB")
    return DEFAULT_DB[precision]


def check_overrides(overrides: dict[str, float], roles: set[str]) -> None:
    """An override whose key names no role or precision would silently gate nothing."""
    for key in overrides:
        role, _, precision = key.rpartition(":")
        if key in ("*", LOWERING) or (not role and (key in roles or key in DEFAULT_DB)) or (
                role in (*roles, LOWERING) and precision in DEFAULT_DB):
            continue
        raise EdgexError(f"--min-db {key}=...: {key!r} is no role ({', '.join(sorted(roles))}), precision or ROLE:PRECISION")
