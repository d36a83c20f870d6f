"""Build or load the eager Qwen3-TTS talker (with its code predictor) and Code2Wav decoder.

Two sources: a preset with seeded random weights, or a local Hugging Face-layout checkpoint
(`config.json` + safetensors at the root for the talker, `speech_tokenizer/` for the decoder).
Random weights use a fan-in scaled init instead of the package's 0.02 default, and non-zero
codebooks, so logits are spread and the waveform is speech-scale (docs/models.md: the default init shrinks
the wav to ~1e-8 and zero codebooks give a constant wav, which would make SNR meaningless).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ...errors import EdgexError
from ...patches.torch_nn import construct_without_random_init
from ...patches.transformers import eager_attention
from ..base import read_config_json, read_safetensors
from .presets import Qwen3TTSPreset
from .qwen_tts_import import qwen_tts_modules


@dataclass
class Qwen3TTSModels:
    talker: nn.Module  # Qwen3TTSTalkerForConditionalGeneration (holds .code_predictor)
    decoder: nn.Module  # Qwen3TTSTokenizerV2Decoder
    source: dict  # what the weights are: preset + seed, or checkpoint path
    speaker_encoder: nn.Module | None = None  # Qwen3TTSSpeakerEncoder (Base checkpoints)
    speech_encoder: nn.Module | None = None  # Qwen3TTSTokenizerV2Encoder (where the speech tokenizer holds it)


def _configs(talker: dict, decoder: dict):
    mods = qwen_tts_modules()
    talker_cfg = mods.config.Qwen3TTSTalkerConfig(**talker)
    decoder_cfg = mods.tokenizer_config.Qwen3TTSTokenizerV2DecoderConfig(**decoder)
    eager_attention(talker_cfg, talker_cfg.code_predictor_config, decoder_cfg)
    return talker_cfg, decoder_cfg


# The module types every parameter of which is written after construction: by the preset's init
# (`_speech_scale_init` draws each Linear / Conv1d / ConvTranspose1d weight and bias and each
# Embedding table) or by a checkpoint's state dict. Their random init at construction (torch's and
# the package's `_init_weights`, about 1e9 draws for the 1.7b talker) is left out.
_WRITTEN_AFTER = (nn.Linear, nn.Conv1d, nn.ConvTranspose1d, nn.Embedding)


def _instantiate(talker_cfg, decoder_cfg):
    mods = qwen_tts_modules()
    with construct_without_random_init(_WRITTEN_AFTER):
        talker = mods.modeling.Qwen3TTSTalkerForConditionalGeneration(talker_cfg)
        decoder = mods.tokenizer_modeling.Qwen3TTSTokenizerV2Decoder(decoder_cfg)
    return talker.eval(), decoder.eval()


@torch.no_grad()
def _speech_scale_init(talker: nn.Module, decoder: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for module in list(talker.modules()) + list(decoder.modules()):
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.ConvTranspose1d)):
            fan_in = module.weight[0].numel() if isinstance(module, (nn.Linear, nn.Conv1d)) else (
                module.weight.shape[0] * module.weight.shape[2] // max(1, module.stride[0])
            )
            module.weight.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
            if module.bias is not None:
                module.bias.normal_(0.0, 0.02, generator=gen)
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, 1.0, generator=gen)
    for name, param in decoder.named_parameters():
        if name.endswith("embedding_sum"):
            param.normal_(0.0, 1.0, generator=gen)
        elif name.endswith(".gamma") or name.endswith("_layer_scale.scale"):
            param.fill_(0.1)
    # Damp each residual unit's output conv so the conv stack does not grow ~3x per block, and
    # scale the last conv so the wav has speech-like RMS (~0.1) and rarely hits the clamp(-1, 1).
    for name, module in decoder.named_modules():
        if name.endswith(".conv2") and isinstance(module.conv, nn.Conv1d):
            module.conv.weight.mul_(0.3)
    decoder.decoder[-1].conv.weight.mul_(0.05)


def speaker_encoder_module(config: dict) -> nn.Module:
    mods = qwen_tts_modules()
    return mods.modeling.Qwen3TTSSpeakerEncoder(mods.config.Qwen3TTSSpeakerEncoderConfig(**config)).eval()


def speech_encoder_module(config: dict) -> nn.Module:
    from transformers import MimiConfig

    cfg = MimiConfig(**{k: v for k, v in config.items() if k != "model_type"})
    eager_attention(cfg)
    return qwen_tts_modules().tokenizer_modeling.Qwen3TTSTokenizerV2Encoder(cfg).eval()


@torch.no_grad()
def voice_scale_init(speaker_encoder: nn.Module | None, speech_encoder: nn.Module | None, seed: int) -> None:
    """Random voice modules whose outputs depend on the audio: fan-in scaled convs and linears, and
    codebooks at the scale of the latent they quantize (the library's zero codebooks give code 0 for
    every frame)."""
    gen = torch.Generator().manual_seed(seed + 1)
    for module in (speaker_encoder, speech_encoder):
        for layer in module.modules() if module is not None else ():
            if isinstance(layer, (nn.Linear, nn.Conv1d)):
                layer.weight.normal_(0.0, 1.0 / math.sqrt(layer.weight[0].numel()), generator=gen)
                if layer.bias is not None:
                    layer.bias.normal_(0.0, 0.02, generator=gen)
    if speech_encoder is None:
        return
    wav = 0.1 * torch.randn(1, 1, 8 * 1920, generator=gen)
    latent = speech_encoder.downsample(speech_encoder.encoder_transformer(speech_encoder.encoder(wav).transpose(1, 2))[0].transpose(1, 2))
    quantizer = speech_encoder.quantizer
    for book in (quantizer.semantic_residual_vector_quantizer, quantizer.acoustic_residual_vector_quantizer):
        projected = book.input_proj(latent) if book.input_proj is not None else latent
        scale = float(projected.std())
        for k, layer in enumerate(book.layers):
            codebook = layer.codebook
            codebook.embed_sum.normal_(0.0, scale / (1 + k) ** 0.5, generator=gen)
            codebook._embed = None


def build_from_preset(preset: Qwen3TTSPreset, seed: int) -> Qwen3TTSModels:
    talker_cfg, decoder_cfg = _configs(preset.talker, preset.decoder)
    torch.manual_seed(seed)
    talker, decoder = _instantiate(talker_cfg, decoder_cfg)
    _speech_scale_init(talker, decoder, seed)
    speaker = speaker_encoder_module(preset.speaker_encoder) if preset.speaker_encoder else None
    speech = speech_encoder_module(preset.speech_encoder) if preset.speech_encoder else None
    voice_scale_init(speaker, speech, seed)
    return Qwen3TTSModels(talker, decoder, {"preset": preset.name, "seed": seed}, speaker, speech)


def _load_into(module: nn.Module, state: dict, prefix: str, what: str) -> None:
    sub = {k[len(prefix):]: v.float() for k, v in state.items() if k.startswith(prefix)}
    expected = module.state_dict()
    missing = [k for k in expected if k not in sub]
    if missing:
        raise EdgexError(f"checkpoint {what} lacks {len(missing)} tensors, e.g. {prefix}{missing[0]}")
    bad = [k for k in expected if tuple(sub[k].shape) != tuple(expected[k].shape)]
    if bad:
        k = bad[0]
        raise EdgexError(
            f"checkpoint {what} tensor {prefix}{k} has shape {tuple(sub[k].shape)}, config says {tuple(expected[k].shape)}"
        )
    module.load_state_dict({k: sub[k] for k in expected}, strict=True)


def load_checkpoint(path: Path) -> Qwen3TTSModels:
    """Load a local Qwen3-TTS checkpoint in the Hugging Face layout (no network, ever)."""
    path = Path(path)
    if not path.is_dir():
        raise EdgexError(f"checkpoint {path} is not a directory")
    config = read_config_json(path / "config.json")
    if "talker_config" not in config:
        raise EdgexError(f"{path / 'config.json'} has no talker_config: not a Qwen3-TTS checkpoint")
    tok_dir = path / "speech_tokenizer"
    tok_config = read_config_json(tok_dir / "config.json")
    talker_state, decoder_state = read_safetensors(path), read_safetensors(tok_dir)
    try:
        talker_cfg, decoder_cfg = _configs(config["talker_config"], tok_config.get("decoder_config", {}))
        talker, decoder = _instantiate(talker_cfg, decoder_cfg)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise EdgexError(f"checkpoint config in {path} is incomplete or invalid: {type(exc).__name__}: {exc}") from None
    _load_into(talker, talker_state, "talker.", "talker")
    _load_into(decoder, decoder_state, "decoder.", "speech tokenizer decoder")
    speaker = speech = None
    try:
        if any(k.startswith("speaker_encoder.") for k in talker_state):
            speaker = speaker_encoder_module({k: v for k, v in (config.get("speaker_encoder_config") or {}).items()
                                              if k != "model_type"})
        if tok_config.get("encoder_config") and any(k.startswith("encoder.") for k in decoder_state):
            speech = speech_encoder_module(tok_config["encoder_config"])
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise EdgexError(f"voice-prompt config in {path} is invalid: {type(exc).__name__}: {exc}") from None
    if speaker is not None:
        _load_into(speaker, talker_state, "speaker_encoder.", "speaker encoder")
    if speech is not None:
        _load_into(speech, decoder_state, "encoder.", "speech tokenizer encoder")
    return Qwen3TTSModels(talker, decoder, {"checkpoint": str(path.resolve())}, speaker, speech)
