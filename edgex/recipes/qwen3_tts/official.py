"""The official Qwen3-TTS model (`Qwen3TTSForConditionalGeneration` from qwen-tts 0.1.1) as the
reference for whole utterances: small checkpoints of each published variant built with the official
classes, the official `generate()` run on a `runner.Request`, and the official decode.

A variant is the published checkpoint's `config.json` (its speaker and language tables, the special
ids, `tts_model_type`) with a preset's widths and depths; weights are seeded random with the
speech-scale init of `models.py`. `stop_at` sets the codec head's EOS row so that the official greedy
utterance of one request ends at a chosen frame: random weights would otherwise pick EOS about once
in 2049 frames, and an utterance that never stops cannot show that a runner stops where the model does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...errors import EdgexError
from ...patches.transformers import eager_attention
from .models import _speech_scale_init, speech_encoder_module, voice_scale_init
from .presets import Qwen3TTSPreset, get_preset
from .qwen_tts_import import qwen_tts_modules
from .runner import Request, Settings, VoicePrompt

# The published checkpoints' tables (Qwen3-TTS-12Hz-{0.6B,1.7B}-{CustomVoice,Base,VoiceDesign} config.json).
LANGUAGES = {"chinese": 2055, "english": 2050, "german": 2053, "italian": 2070, "portuguese": 2071, "spanish": 2054,
             "japanese": 2058, "korean": 2064, "french": 2061, "russian": 2069, "beijing_dialect": 2074,
             "sichuan_dialect": 2062}
SPEAKERS = {"serena": 3066, "vivian": 3065, "uncle_fu": 3010, "ryan": 3061, "aiden": 2861, "ono_anna": 2873,
            "sohee": 2864, "eric": 2875, "dylan": 2878}
DIALECTS = {**{name: False for name in SPEAKERS}, "eric": "sichuan_dialect", "dylan": "beijing_dialect"}
VARIANTS = {
    "custom_voice": dict(spk_id=SPEAKERS, spk_is_dialect=DIALECTS),
    "base": dict(spk_id={}, spk_is_dialect={}),
    "voice_design": dict(spk_id={}, spk_is_dialect={}),
}


@dataclass
class OfficialModel:
    model: torch.nn.Module  # Qwen3TTSForConditionalGeneration
    decoder: torch.nn.Module  # Qwen3TTSTokenizerV2Decoder
    variant: str
    speech_encoder: torch.nn.Module | None = None  # Qwen3TTSTokenizerV2Encoder (the speech tokenizer's encoder)


def build(variant: str, preset: str = "tiny", seed: int = 0, overrides: dict | None = None) -> OfficialModel:
    """`overrides`: config.json keys set over the variant's (`talker_config` merged key by key), e.g. a
    smaller text vocabulary with its own special ids."""
    overrides = dict(overrides or {})
    if variant not in VARIANTS:
        raise EdgexError(f"no such Qwen3-TTS variant {variant!r} (known: {', '.join(VARIANTS)})")
    spec: Qwen3TTSPreset = get_preset(preset)
    mods = qwen_tts_modules()
    hidden = spec.talker["hidden_size"]
    talker = {**spec.talker, **VARIANTS[variant], "codec_language_id": LANGUAGES, **overrides.pop("talker_config", {})}
    encoder = {**(spec.speaker_encoder or {}), "enc_dim": hidden}
    config = mods.config.Qwen3TTSConfig(talker_config=talker, speaker_encoder_config=encoder, tts_model_type=variant,
                                        tts_model_size="0b6", tokenizer_type="qwen3_tts_tokenizer_12hz", **overrides)
    decoder_config = mods.tokenizer_config.Qwen3TTSTokenizerV2DecoderConfig(**spec.decoder)
    eager_attention(config, config.talker_config, config.talker_config.code_predictor_config, config.speaker_encoder_config,
                    decoder_config)
    torch.manual_seed(seed)
    model = mods.modeling.Qwen3TTSForConditionalGeneration(config).eval()
    decoder = mods.tokenizer_modeling.Qwen3TTSTokenizerV2Decoder(decoder_config).eval()
    _speech_scale_init(model.talker, decoder, seed)
    speech = speech_encoder_module(spec.speech_encoder) if spec.speech_encoder else None
    voice_scale_init(model.speaker_encoder, speech, seed)
    return OfficialModel(model, decoder, variant, speech)


def wrap(talker: torch.nn.Module, decoder: torch.nn.Module, config: dict) -> OfficialModel:
    """The official model around an already loaded talker and decoder (the eager model edgex exports
    from), with `config` a Qwen3-TTS config.json as a dict. The wrapper's own modules are built on the
    meta device and its talker replaced: `generate()` reads only the talker and the config."""
    mods = qwen_tts_modules()
    missing = [key for key in TABLES if not isinstance((config.get("talker_config") or {}).get(key), dict)]
    if missing:
        raise EdgexError(f"config.json's talker_config has no {', '.join(missing)}: the official Qwen3-TTS code reads them "
                         f"(a published config holds all of {', '.join(TABLES)}; a Base checkpoint's spk_id is {{}})")
    config = {**config, "speaker_encoder_config": {k: v for k, v in (config.get("speaker_encoder_config") or {}).items()
                                                   if k != "model_type"}}
    cfg = mods.config.Qwen3TTSConfig(**config)
    eager_attention(cfg, cfg.talker_config, cfg.talker_config.code_predictor_config, cfg.speaker_encoder_config)
    with torch.device("meta"):
        model = mods.modeling.Qwen3TTSForConditionalGeneration(cfg)
    model.talker = talker
    model.speaker_encoder = None
    return OfficialModel(model.eval(), decoder, cfg.tts_model_type or "custom_voice")


TABLES = ("spk_id", "spk_is_dialect", "codec_language_id")  # the talker_config tables generate() reads


def preset_config(talker_config: dict, variant: str = "custom_voice") -> dict:
    """A preset's config.json as the published `variant`'s: its talker with that variant's tables."""
    return dict(talker_config={**talker_config, **VARIANTS[variant], "codec_language_id": LANGUAGES},
                tts_model_type=variant, tts_model_size="0b6", tokenizer_type="qwen3_tts_tokenizer_12hz")


def _tensor(ids) -> torch.Tensor:
    return torch.from_numpy(np.asarray(ids, np.int64).reshape(1, -1))


def generate_kwargs(request: Request, settings: Settings) -> dict:
    """The official `generate()` arguments for one request (a batch of one)."""
    kwargs = dict(input_ids=[_tensor(request.text_ids)], languages=[request.language],
                  non_streaming_mode=request.non_streaming, max_new_tokens=settings.max_new_tokens,
                  do_sample=settings.do_sample, top_k=settings.top_k, top_p=settings.top_p,
                  temperature=settings.temperature, subtalker_dosample=settings.subtalker_dosample,
                  subtalker_top_k=settings.subtalker_top_k, subtalker_top_p=settings.subtalker_top_p,
                  subtalker_temperature=settings.subtalker_temperature, repetition_penalty=settings.repetition_penalty)
    if request.speaker:
        kwargs["speakers"] = [request.speaker]
    if request.instruct is not None:
        kwargs["instruct_ids"] = [_tensor(request.instruct)]
    voice = request.voice
    if voice is not None:
        kwargs["voice_clone_prompt"] = {
            "ref_code": [torch.from_numpy(np.asarray(voice.ref_codes, np.int64)) if voice.in_context else None],
            "ref_spk_embedding": [torch.from_numpy(np.asarray(voice.speaker_embedding, np.float32))],
            "x_vector_only_mode": [not voice.in_context], "icl_mode": [voice.in_context]}
        kwargs["ref_ids"] = [_tensor(voice.ref_ids) if voice.in_context else None]
    return kwargs


@torch.no_grad()
def official_run(official: OfficialModel, request: Request, settings: Settings) -> tuple[np.ndarray, list[torch.Tensor]]:
    """The official utterance's codes [T, 16] (the frames before EOS) and the talker hidden state [H]
    each codebook-0 choice was made from (one per generation step, the EOS step included)."""
    seen: list[torch.Tensor] = []
    handle = official.model.talker.codec_head.register_forward_hook(lambda _m, args, _out: seen.append(args[0][0, -1].detach().clone()))
    try:
        codes, _ = official.model.generate(**generate_kwargs(request, settings))
    finally:
        handle.remove()
    return codes[0].numpy().astype(np.int64), seen


def official_codes(official: OfficialModel, request: Request, settings: Settings) -> np.ndarray:
    """The official utterance's codes [T, 16] (the frames before EOS)."""
    return official_run(official, request, settings)[0]


@torch.no_grad()
def official_waveform(official: OfficialModel, codes: np.ndarray, voice: VoicePrompt | None = None) -> np.ndarray:
    """The official decode (`Qwen3TTSTokenizerV2Model.decode`: the decoder's `chunked_decode`), an
    in-context prompt's reference frames first and their share of the waveform cut, as the official
    wrapper (`generate_voice_clone`) does."""
    codes = torch.from_numpy(np.asarray(codes, np.int64).reshape(-1, 16))
    ref = torch.from_numpy(np.asarray(voice.ref_codes, np.int64)) if voice is not None and voice.in_context else codes[:0]
    total = torch.cat([ref, codes])
    wav = official.decoder.chunked_decode(total.T[None]).reshape(-1).numpy()
    cut = int(len(ref) / max(len(total), 1) * wav.shape[0])
    return wav[cut:]


@torch.no_grad()
def stop_at(official: OfficialModel, request: Request, frame: int, margin: float = 1.0) -> None:
    """Set the codec head's EOS row so that the official greedy utterance of `request` stops after
    `frame` frames: orthogonal to the talker hidden states of the earlier frames (EOS scores 0 there,
    below the best code), and `margin` above the best code's raw logit at `frame`."""
    talker = official.model.talker
    _, seen = official_run(official, request, Settings(max_new_tokens=frame + 2, do_sample=False, subtalker_dosample=False))
    seen = [h.double() for h in seen]
    if len(seen) <= frame:
        raise EdgexError(f"the talker ran {len(seen)} steps, fewer than the {frame + 1} needed to stop at frame {frame}")
    eos = official.model.config.talker_config.codec_eos_token_id
    target = seen[frame]
    earlier = torch.stack(seen[:frame], dim=1) if frame else None
    if earlier is not None:
        basis, _ = torch.linalg.qr(earlier)
        target_free = target - basis @ (basis.T @ target)
    else:
        target_free = target
    best = float(talker.codec_head(target.float()[None])[0, :2048].max())
    row = (best + margin) * target_free / float(target_free @ target)
    talker.codec_head.weight[eos] = row.float()
    got = official_codes(official, request, Settings(max_new_tokens=frame + 8, do_sample=False, subtalker_dosample=False))
    if len(got) != frame:
        raise EdgexError(f"the EOS row stops the official utterance after {len(got)} frames, not {frame}")


def write_checkpoint(official: OfficialModel, path: Path) -> Path:
    """The model in the published layout: config.json + model.safetensors (`talker.`, `speaker_encoder.`)
    and speech_tokenizer/config.json + model.safetensors (`decoder.`, and `encoder.` with its
    `encoder_config` where the model has the speech tokenizer's encoder)."""
    from safetensors.torch import save_file

    path = Path(path)
    (path / "speech_tokenizer").mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(official.model.config.to_dict(), indent=1))
    save_file({k: v.detach().contiguous().clone() for k, v in official.model.state_dict().items()}, str(path / "model.safetensors"))
    tokenizer = {"model_type": "qwen3_tts_tokenizer_12hz", "decoder_config": official.decoder.config.to_dict()}
    tensors = {f"decoder.{k}": v.detach().contiguous().clone() for k, v in official.decoder.state_dict().items()}
    if official.speech_encoder is not None:
        tokenizer["encoder_config"] = official.speech_encoder.config.to_dict()
        tensors |= {f"encoder.{k}": v.detach().contiguous().clone() for k, v in official.speech_encoder.state_dict().items()}
    (path / "speech_tokenizer" / "config.json").write_text(json.dumps(tokenizer, indent=1))
    save_file(tensors, str(path / "speech_tokenizer" / "model.safetensors"))
    return path
