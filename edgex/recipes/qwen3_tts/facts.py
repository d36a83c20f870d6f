"""What `qwen3-tts` declares without importing torch: presets, components and their roles.

Components (role):
  talker_prefill (talker)        fixed prompt chunk -> logits, hidden, KV for the cache
  talker_decode (talker)         one KV-cached step per 80 ms frame
  code_predictor (predictor)     the 15 residual codebooks of a frame in one graph
  code_predictor_step (predictor) one predictor position: the fallback runner loop
  code2wav (decoder)             72 context + 25 new frames -> wav of the new frames
  code2latent (decoder)          exact streaming, part 1: codes -> latents, rolling KV
  latent2wav (decoder)           exact streaming, part 2: latents + 12 frames context -> wav
  speaker_encoder (voice)        reference audio's log-mel -> speaker embedding (Base; on request)
  speech_encoder (voice)         reference audio -> its 16 codebooks' codes (on request)

The model itself is built by `recipe.py`, which the registry imports only once work starts.
"""

from __future__ import annotations

from ..base import ComponentPrecisions, RecipeFacts, RecipeOption
from .libmtmd_facts import declared_files
from .presets import PRESETS

ROLES = {
    "talker_prefill": "talker",
    "talker_decode": "talker",
    "code_predictor": "predictor",
    "code_predictor_step": "predictor",
    "code2wav": "decoder",
    "code2latent": "decoder",
    "latent2wav": "decoder",
    "speaker_encoder": "voice",
    "speech_encoder": "voice",
}
_VOICE = ("a voice-prompt graph, for apps that clone a voice on the device: built when named (--component), "
          "from a checkpoint that holds it ({what}); apps that ship a fixed voice use `edgex voice-prompt` instead")
ON_REQUEST = {"speaker_encoder": _VOICE.format(what="a Base checkpoint's speaker_encoder"),
              "speech_encoder": _VOICE.format(what="the speech tokenizer's encoder")}

# Schemes whose own error flips the component's tokens beyond the tie margin (0.063 x rms(logits),
# `edgex.parity.gates.TIE_DB`): measured on the tiny preset, seed 0, by `scripts/scheme_table.py`
# (docs/precisions.md, "Placed by default"); the scheme figure alone (the file's weights in eager
# PyTorch) flips them, the lowering none.
_PREFILL_4BIT = ("int4 weights alone flip the prefill's top-1 token beyond the tie margin (tiny: {figure}); "
                 "talker_decode keeps every top-1 at the same scheme")
# The speech encoder's codes are nearest-codebook choices, compared exactly: fp16 rounding moves the
# latent enough to pick other entries (tiny, 40 frames x 16 codebooks: ONNX fp16 codes agreement 0.99,
# ExecuTorch fp16 0.96, latent 63.3 / 59.7 dB; fp32 1.00 at 121.8 / 120.7 dB).
_CODES_FP16 = ("fp16 flips the reference codes (nearest-codebook choices, compared exactly; tiny: ONNX fp16 "
               "agreement 0.99, ExecuTorch fp16 0.96; fp32 1.00)")
FP32_COMPONENTS = {"speech_encoder": _CODES_FP16}
# At the published size the per-frame graphs' int4 weights flip top-1 tokens too (0.6b preset, seed 0, Core ML w4,
# `edgex export qwen3-tts --target apple --preset 0.6b -c talker_decode -c code_predictor_step -p w4`): the scheme
# figure flips them as the artifact does, and the lowering scores 54.8 / 58.3 dB.
_FRAME_4BIT = ("int4 weights alone flip {what}'s top-1 token beyond the tie margin at the published size (0.6b: scheme "
               "{figure}); the tiny preset keeps every top-1")
COARSE = {
    "speech_encoder": {"fp16": _CODES_FP16},
    "talker_decode": {"w4": _FRAME_4BIT.format(
        what="talker_decode", figure="15.7 dB, utterance_a_frame10 flips at 3.8 x the margin; lowering 54.8 dB")},
    "code_predictor_step": {"w4": _FRAME_4BIT.format(
        what="the predictor step", figure="11.1 dB, utterance_b_frame30_step1 flips at 3.2 x the margin; lowering 58.3 dB")},
    "talker_prefill": {
        "q4_0": _PREFILL_4BIT.format(figure="scheme 15.7 dB, 13 of 15 flips not ties, top-1 0.44; lowering 41.8 dB"),
        "w4": _PREFILL_4BIT.format(figure="scheme 16.7 dB, 9 of 12 flips not ties, top-1 0.62; lowering 61.8 dB"),
    },
    # benchmarks/bench_planted_graph.py, faithful row: its failure is the scheme's, as a planted bug's would be
    "code_predictor": {
        "w4": ("int4 weights alone flip the unrolled predictor's codes beyond the tie margin (tiny: scheme 12.9 dB, "
               "27 of 35 flips not ties, worst 16.0 x the margin, codes agreement 0.47; lowering 60.3 dB); "
               "code_predictor_step passes at the same scheme"),
        # `edgex export qwen3-tts --target s25-htp --precision w8a16 -c code_predictor` (tiny): the
        # sampling add and argmax stay float (`sampling_nodes`), and the sampled sample's worst flip
        # (1.3 x the margin end to end) is of the size the scheme's own flips reach, not a clipped noise's
        "w8a16": ("static int8 weights / int16 activations alone flip the unrolled predictor's top-1 beyond the tie "
                  "margin (tiny, s25-htp: scheme 25.1 dB, 2 of 9 flips not ties, worst 1.98 x the margin; "
                  "lowering 20.7 dB, 6 of 11 not ties, worst 1.69 x); code_predictor_step passes at the same scheme"),
    },
}

# A CPU runtime that calls a method in microseconds runs the predictor as the runner's loop over
# code_predictor_step (docs/runtime-contract.md); the unrolled frame is for runtimes where one graph
# call costs milliseconds (an NPU context, ONNX Runtime's session). Its XNNPACK lowering is the
# costliest build of the model (0.6b: 786 s at fp16, a third of the whole export's build time), so
# ExecuTorch builds it only when placed by name; `edgex pipeline` scores the looped step graph in situ.
PLACED_PRECISIONS = {"code_predictor": ComponentPrecisions(
    {"executorch": ()},
    "ExecuTorch runs the predictor as the runner's loop over code_predictor_step; the unrolled frame's XNNPACK "
    "lowering is the model's costliest build (0.6b fp16: 786 s) and is built only when placed by name "
    "(--placement code_predictor=executorch:fp32)")}
# XNNPACK sums fp16 products in fp16 where the CPU has fp16 arithmetic (AVX512-FP16, Arm phones):
# the vocoder's conv stack then loses more than the fp16 gate allows at the published size, and its
# matmul-only floor (`edgex.parity.half_arithmetic`) does not model convolutions. code2latent (a
# transformer) keeps its fp16 .pte.
_VOCODER_FP16 = ComponentPrecisions(
    {"executorch": ("fp32",)},
    "XNNPACK's fp16 sums (CPUs with fp16 arithmetic: AVX512-FP16, Arm) are too coarse for the vocoder's conv stack at "
    "the published size (0.6b preset, AVX512-FP16 host: code2wav fp16 .pte 26.3 dB, latent2wav 27.2 dB against a 30 dB "
    "gate; ONNX Runtime fp16, fp32 sums: 54.3 / 57.2 dB); --placement COMPONENT=executorch:fp16 builds it")
PLACED_PRECISIONS["code2wav"] = PLACED_PRECISIONS["latent2wav"] = _VOCODER_FP16

FACTS = RecipeFacts(
    name="qwen3-tts",
    description="Qwen3-TTS 12 Hz: talker (prefill + decode), code predictor, Code2Wav (window + streaming)",
    presets={name: p.description for name, p in PRESETS.items()},
    components=ROLES,
    coarse=COARSE,
    on_request=ON_REQUEST,
    # the voice-prompt encoders are conv stacks over audio, as the decoders are (a GPU or CPU graph
    # beside the language-model roles on the NPU)
    placed_like={"voice": "decoder"},
    fp32_components=FP32_COMPONENTS,
    # The decoders' waveforms are judged by what they sound like (their spectrogram), their SNR
    # recorded beside it: the components' parity and the in-situ decoder stage alike.
    spectral_outputs={"code2wav": ("wav",), "latent2wav": ("wav",)},
    unrolled_steps={"code_predictor": 15},  # num_code_groups - 1 (16 in every preset)
    options={"max_context": RecipeOption("talker KV slots of talker_decode (tiny 64, real presets / checkpoint 256)"),
             "reference_frames": RecipeOption("80 ms frames of reference audio the voice-prompt graphs take (default 40: 3.2 s)")},
    reference_packages=("transformers", "qwen-tts", "safetensors"),
    placed_precisions=PLACED_PRECISIONS,
    declared_files=declared_files,
)
