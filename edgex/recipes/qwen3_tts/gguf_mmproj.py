"""The code predictor, Code2Wav and speaker encoder in llama.cpp's Qwen3-TTS "mmproj" GGUF.

llama.cpp's converter (`Qwen3TTSSpeakerEncoderModel`, `convert_hf_to_gguf.py --mmproj`) writes one
`clip` file holding the speaker encoder (Base checkpoints), the code predictor and Code2Wav; libmtmd
runs the predictor (`MTMD_GEN_PROCESS_TYPE_GEN_CODE`) and Code2Wav (`..._GEN_WAV`) from it. Its
conventions, followed here so that libmtmd loads the file:
  * the 15 predictor embedding tables and heads are stacked into 3-D tensors, the talker's codec
    embedding (code 0's table) rides along as `a.gen.code.out_embd`;
  * Code2Wav's RVQ codebooks are the running sums over their usage, SnakeBeta's alpha / beta are
    folded (exp(alpha), 1 / (exp(beta) + 1e-9)); conv kernels are never block-quantized (ggml's
    conv kernels take F16 / F32 only), transposed-conv kernels and the predictor's `ffn_down` stay F32;
  * libmtmd refuses a file without an input encoder, so the speaker encoder must be there.

libmtmd hard-codes much of Code2Wav; what a checkpoint must match, and the reason where it does not,
is `libmtmd_facts` (light: a plan states it before anything is built).
"""

from __future__ import annotations

import re

import numpy as np

from ...layouts import CODEC_EMBEDS, GEN_CODE0, GEN_CODES, GEN_HIDDEN, GEN_LOGITS, GEN_NOISE, GEN_WAV, GEN_WAV_CODES, GgufLayout, LlamaFeed
from .libmtmd_facts import unsupported_reason

ARCH = "clip"
DAC_RESIDUAL_UNITS = 3  # dilations 1, 3, 9
SPEAKER_STAGES = 3  # SE-Res2Net blocks 1..3 (the converter's `clip.audio.block_count`)

_PREDICTOR_LAYER = {
    "input_layernorm": "ln1", "self_attn.q_proj": "attn_q", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_proj": "attn_k", "self_attn.k_norm": "attn_k_norm", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_out", "post_attention_layernorm": "ln2", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_TFM_LAYER = {
    "input_layernorm.weight": "ln1", "self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v", "self_attn.o_proj.weight": "attn_out", "self_attn_layer_scale.scale": "ls1",
    "post_attention_layernorm.weight": "ln2", "mlp.gate_proj.weight": "ffn_gate", "mlp.up_proj.weight": "ffn_up",
    "mlp.down_proj.weight": "ffn_down", "mlp_layer_scale.scale": "ls2",
}
_UPSAMPLE = {
    "0.conv.weight": "conv.weight", "0.conv.bias": "conv.bias", "1.dwconv.conv.weight": "dwconv.weight",
    "1.dwconv.conv.bias": "dwconv.bias", "1.norm.weight": "norm.weight", "1.norm.bias": "norm.bias",
    "1.pwconv1.weight": "pw1.weight", "1.pwconv1.bias": "pw1.bias", "1.pwconv2.weight": "pw2.weight",
    "1.pwconv2.bias": "pw2.bias", "1.gamma": "gamma",
}

PREDICTOR_FEED = LlamaFeed((GEN_HIDDEN, GEN_CODE0, GEN_NOISE), (GEN_CODES, GEN_LOGITS, CODEC_EMBEDS))
CODE2WAV_FEED = LlamaFeed((GEN_WAV_CODES,), (GEN_WAV,))


def _np(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def predictor_tensors(talker) -> dict[str, np.ndarray]:
    """The code predictor as the converter names it, with code 0's table (the talker's codec embedding)."""
    predictor = talker.code_predictor
    tensors = {
        "a.gen.code.embd.weight": np.stack([_np(t.weight) for t in predictor.model.codec_embedding]),
        "a.gen.code.head.weight": np.stack([_np(h.weight) for h in predictor.lm_head]),
        "a.gen.code.out_embd.weight": _np(talker.model.codec_embedding.weight),
        "a.gen.code.output_norm.weight": _np(predictor.model.norm.weight),
    }
    project = predictor.small_to_mtp_projection
    if hasattr(project, "weight"):  # Identity where the talker and predictor widths match
        tensors["a.gen.code.proj_in.weight"] = _np(project.weight)
        if project.bias is not None:
            tensors["a.gen.code.proj_in.bias"] = _np(project.bias)
    for i, layer in enumerate(predictor.model.layers):
        modules = dict(layer.named_modules())
        for hf, gg in _PREDICTOR_LAYER.items():
            tensors[f"a.gen.code.blk.{i}.{gg}.weight"] = _np(modules[hf].weight)
    return tensors


def _snake(alpha, beta) -> tuple[np.ndarray, np.ndarray]:
    """SnakeBeta's log-scale parameters folded as the converter folds them."""
    import torch

    return _np(torch.exp(alpha)), _np(1.0 / (torch.exp(beta) + 1e-9))


def code2wav_tensors(decoder) -> dict[str, np.ndarray]:
    """The speech tokenizer's decoder as the converter names it (`_generate_code2wav_tensors`)."""
    state = decoder.state_dict()
    quantizer = decoder.quantizer
    tensors = {}
    for group, short in (("rvq_first", "first"), ("rvq_rest", "rest")):
        rvq = getattr(quantizer, group)
        books = [_np(vq._codebook.embedding_sum / vq._codebook.cluster_usage.clamp_min(1e-5)[:, None]) for vq in rvq.vq.layers]
        tensors[f"a.gen.wav.quant.{short}.codebook.weight"] = books[0] if short == "first" else np.stack(books)
        tensors[f"a.gen.wav.quant.{short}.in_proj.weight"] = _np(rvq.input_proj.weight.squeeze(-1))
        tensors[f"a.gen.wav.quant.{short}.out_proj.weight"] = _np(rvq.output_proj.weight.squeeze(-1))
    tensors["a.gen.wav.pre_conv.weight"] = _np(state["pre_conv.conv.weight"])
    tensors["a.gen.wav.pre_conv.bias"] = _np(state["pre_conv.conv.bias"])
    for hf, gg in (("input_proj", "in_proj"), ("output_proj", "out_proj")):
        for kind in ("weight", "bias"):
            tensors[f"a.gen.wav.tfm.{gg}.{kind}"] = _np(state[f"pre_transformer.{hf}.{kind}"])
    tensors["a.gen.wav.tfm.output_norm.weight"] = _np(state["pre_transformer.norm.weight"])
    for i in range(len(decoder.pre_transformer.layers)):
        for hf, gg in _TFM_LAYER.items():
            tensors[f"a.gen.wav.tfm.blk.{i}.{gg}.weight"] = _np(state[f"pre_transformer.layers.{i}.{hf}"])
    for i in range(len(decoder.upsample)):
        for hf, gg in _UPSAMPLE.items():
            tensors[f"a.gen.wav.up.blk.{i}.{gg}"] = _np(state[f"upsample.{i}.{hf}"])
    tensors["a.gen.wav.dac.entry.weight"] = _np(state["decoder.0.conv.weight"])
    tensors["a.gen.wav.dac.entry.bias"] = _np(state["decoder.0.conv.bias"])
    blocks = len(decoder.decoder) - 3  # entry conv, blocks, post snake, post conv
    for b in range(blocks):
        py = f"decoder.{b + 1}.block"
        dac = f"a.gen.wav.dac.blk.{b}"
        tensors[f"{dac}.snake.alpha"], tensors[f"{dac}.snake.beta"] = _snake(state[f"{py}.0.alpha"], state[f"{py}.0.beta"])
        tensors[f"{dac}.conv.weight"] = _np(state[f"{py}.1.conv.weight"])
        tensors[f"{dac}.conv.bias"] = _np(state[f"{py}.1.conv.bias"])
        for x in range(DAC_RESIDUAL_UNITS):
            unit = f"{py}.{x + 2}"
            for act in ("act1", "act2"):
                tensors[f"{dac}.res.{x}.{act}.alpha"], tensors[f"{dac}.res.{x}.{act}.beta"] = _snake(
                    state[f"{unit}.{act}.alpha"], state[f"{unit}.{act}.beta"])
            for conv in ("conv1", "conv2"):
                for kind in ("weight", "bias"):
                    tensors[f"{dac}.res.{x}.{conv}.{kind}"] = _np(state[f"{unit}.{conv}.conv.{kind}"])
    post = blocks + 1
    tensors["a.gen.wav.dac.post_snake.alpha"], tensors["a.gen.wav.dac.post_snake.beta"] = _snake(
        state[f"decoder.{post}.alpha"], state[f"decoder.{post}.beta"])
    tensors["a.gen.wav.dac.post_conv.weight"] = _np(state[f"decoder.{post + 1}.conv.weight"])
    tensors["a.gen.wav.dac.post_conv.bias"] = _np(state[f"decoder.{post + 1}.conv.bias"])
    return tensors


def speaker_tensors(encoder) -> dict[str, np.ndarray]:
    """The ECAPA-TDNN speaker encoder as gguf-py's tensor map names it for qwen3tts (the names
    clip.cpp's loader asks for)."""
    tensors = {}
    for hf, value in encoder.state_dict().items():
        kind = hf.rsplit(".", 1)[1]
        parts = hf.split(".")
        if hf.startswith("blocks.0.conv."):
            name = f"a.conv1d.0.{kind}"
        elif parts[0] == "blocks":
            stage = int(parts[1])
            rest = ".".join(parts[2:-1])
            if rest.startswith("res2net_block.blocks."):
                name = f"a.blk.{stage}.res2.{int(parts[4])}.{kind}"
            else:
                short = {"tdnn1.conv": "conv_pw1", "tdnn2.conv": "conv_pw2", "se_block.conv1": "se_conv1",
                         "se_block.conv2": "se_conv2"}[rest]
                name = f"a.blk.{stage}.{short}.{kind}"
        else:
            short = {"mfa.conv": "a.conv_out", "asp.conv": "a.asp_attn", "asp.tdnn.conv": "a.asp_tdnn", "fc": "mm.a.fc"}[
                hf.rsplit(".", 1)[0]]
            name = f"{short}.{kind}"
        tensors[name] = _np(value)
    return tensors


_CONV_KERNELS = re.compile(r"a\.gen\.wav\.(pre_conv|dac\.entry|dac\.post_conv|up\.blk\.\d+\.dwconv|dac\.blk\.\d+\.res\.\d+\.conv[12])"
                           r"\.weight|a\.(conv1d\.0|blk\.\d+\.(conv_pw[12]|se_conv[12]|res2\.\d+)|conv_out|asp_attn|asp_tdnn)\.weight"
                           r"|mm\.a\.fc\.weight")
_F32 = re.compile(r"a\.gen\.code\.blk\.\d+\.ffn_down\.weight|a\.gen\.wav\.(up|dac)\.blk\.\d+\.conv\.weight")


def stored_type(name: str) -> str | None:
    """The converter's forced types (`tensor_force_quant`): "F32" for transposed-conv kernels (ggml
    has F16 / F32 kernels only there, the converter keeps F32) and the predictor's ffn_down (its
    activations exceed the F16 range); "F16" (at most) for conv kernels, which ggml's conv_1d /
    conv_1d_dw take in F16 or F32 only; None: the precision's own type."""
    if _F32.fullmatch(name):
        return "F32"
    if _CONV_KERNELS.fullmatch(name):
        return "F16"
    return None


def mmproj_metadata(talker_config, predictor_config) -> dict:
    """The keys the converter writes (`set_gguf_parameters`): the speaker encoder's (placeholders
    clip.cpp needs to load it) and the predictor's; Code2Wav's sizes are clip.cpp's own."""
    width = int(talker_config.hidden_size)
    return {
        "general.type": "mmproj",
        "general.name": "qwen3-tts mmproj (edgex)",
        "clip.has_audio_encoder": True,
        "clip.audio.projector_type": "qwen3tts_spkenc",
        "clip.audio.projection_dim": width,
        "clip.audio.num_mel_bins": 128,
        "clip.audio.block_count": SPEAKER_STAGES,
        "clip.audio.embedding_length": 1536,
        "clip.audio.attention.head_count": 1,
        "clip.audio.feed_forward_length": 1536,
        "clip.audio.attention.layer_norm_epsilon": 1e-5,
        "clip.has_gen_audio_encoder": True,
        "clip.gen.audio.projector_type": "qwen3tts_gen",
        "clip.gen.audio.projection_dim": width,
        "clip.gen.audio.embedding_length": int(predictor_config.hidden_size),
        "clip.gen.audio.feed_forward_length": int(predictor_config.intermediate_size),
        "clip.gen.audio.block_count": int(predictor_config.num_hidden_layers),
        "clip.gen.audio.attention.head_count": int(predictor_config.num_attention_heads),
        "clip.gen.audio.attention.head_count_kv": int(predictor_config.num_key_value_heads),
        "clip.gen.audio.attention.layer_norm_epsilon": float(predictor_config.rms_norm_eps),
    }


def mmproj_layouts(models, component: str, new_frames: int = 0) -> dict[str, GgufLayout]:
    """`{"gguf": layout}` for a component libmtmd runs (`code_predictor`, `code2wav`), or {} where
    llama.cpp cannot run this checkpoint's (`unsupported_reason`, stated at plan time)."""
    if unsupported_reason(_config_dict(models.talker.config), _config_dict(models.decoder.config),
                          models.speaker_encoder is not None):
        return {}
    feed = PREDICTOR_FEED if component == "code_predictor" else LlamaFeed(CODE2WAV_FEED.inputs, CODE2WAV_FEED.outputs,
                                                                           new_frames=new_frames)
    return {"gguf": mmproj_layout(models, feed)}


def mmproj_layout(models, feed: LlamaFeed) -> GgufLayout:
    """The whole mmproj file (libmtmd loads nothing less); `feed` says which part a component runs."""

    def tensors():
        return speaker_tensors(models.speaker_encoder) | predictor_tensors(models.talker) | code2wav_tensors(models.decoder)

    talker_config = models.talker.config
    meta = mmproj_metadata(talker_config, talker_config.code_predictor_config)
    return GgufLayout(ARCH, meta, tensors, feed, type_rule=stored_type)


def _config_dict(config) -> dict:
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)
