"""Qwen3-TTS configurations: the real 0.6B / 1.7B checkpoint values and a tiny test preset.

The qwen-tts package defaults are not the checkpoint values (docs/models.md): `text_vocab_size`,
`head_dim`, the mrope `rope_scaling` keys and the decoder `codebook_dim` must be set explicitly.
The tiny preset keeps the real vocabularies, codebook counts, frame rate and decoder window (and the
decoder transformer's depth and head count) and shrinks only widths and depths, so every graph has the
real interface and exports in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import EdgexError

# Special codec ids sit above the 2048 audio codes in the 3072-entry codec vocabulary.
_CODEC_SPECIAL = dict(
    codec_pad_id=2148,
    codec_bos_id=2149,
    codec_eos_token_id=2150,
    codec_think_id=2154,
    codec_nothink_id=2155,
    codec_think_bos_id=2156,
    codec_think_eos_id=2157,
)


@dataclass(frozen=True)
class Qwen3TTSPreset:
    """Plain dictionaries for the talker config and the Code2Wav decoder config."""

    name: str
    talker: dict
    decoder: dict
    description: str
    # The voice-prompt modules of a Base checkpoint (`voice.py`): the speaker encoder's config
    # (`Qwen3TTSSpeakerEncoderConfig`, its `enc_dim` the talker's hidden size) and the speech
    # tokenizer encoder's (`MimiConfig`); None where the preset does not declare them.
    speaker_encoder: dict | None = None
    speech_encoder: dict | None = None


def _talker(hidden, layers, heads, kv, head_dim, mlp, text_hidden, predictor, mrope):
    return dict(
        vocab_size=3072,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        hidden_act="silu",
        rms_norm_eps=1e-6,
        rope_theta=1000000,
        rope_scaling={"mrope_section": mrope, "interleaved": True, "rope_type": "default"},
        num_code_groups=16,
        text_hidden_size=text_hidden,
        text_vocab_size=151936,
        code_predictor_config=predictor,
        **_CODEC_SPECIAL,
    )


def _predictor(hidden, layers, heads, kv, head_dim, mlp):
    return dict(
        vocab_size=2048,
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=head_dim,
        rms_norm_eps=1e-6,
        rope_theta=1000000,
        num_code_groups=16,
    )


def _decoder(codebook_dim, hidden, latent, layers, heads, mlp, decoder_dim):
    return dict(
        codebook_size=2048,
        codebook_dim=codebook_dim,
        hidden_size=hidden,
        latent_dim=latent,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=hidden // heads,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        sliding_window=72,
        num_quantizers=16,
        upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2],
        decoder_dim=decoder_dim,
    )


_REAL_DECODER = _decoder(codebook_dim=512, hidden=512, latent=1024, layers=8, heads=16, mlp=1024, decoder_dim=1536)

PRESETS: dict[str, Qwen3TTSPreset] = {
    p.name: p
    for p in (
        Qwen3TTSPreset(
            "tiny",
            _talker(64, 2, 4, 2, 16, 128, 32, _predictor(64, 2, 4, 2, 16, 128), [4, 2, 2]),
            # The decoder's transformer at the published depth and head count (8 layers, 16 heads: sizes
            # llama.cpp's libmtmd hard-codes) on 64 channels, so its mmproj runs this preset too.
            _decoder(codebook_dim=32, hidden=64, latent=64, layers=8, heads=16, mlp=128, decoder_dim=96),
            "real vocabularies and interfaces, 2-layer talker/predictor, 64-wide 8-layer decoder; seconds to export",
            dict(enc_dim=64, enc_channels=[64, 64, 64, 64, 192], enc_attention_channels=32, enc_se_channels=32),
            # Mimi at the published frame rate (24 kHz, strides 4 x 5 x 6 x 8 then 2: 1920 samples a
            # frame), 16 codebooks of 2048, widths and depths shrunk.
            dict(hidden_size=32, num_filters=8, num_hidden_layers=1, intermediate_size=64, num_attention_heads=2,
                 num_key_value_heads=2, head_dim=16, codebook_size=2048, codebook_dim=16,
                 vector_quantization_hidden_dimension=16, num_quantizers=16, upsample_groups=32),
        ),
        Qwen3TTSPreset(
            "0.6b",
            _talker(1024, 28, 16, 8, 128, 3072, 2048, _predictor(1024, 5, 16, 8, 128, 3072), [24, 20, 20]),
            _REAL_DECODER,
            "Qwen3-TTS-12Hz-0.6B configuration, seeded random weights",
        ),
        Qwen3TTSPreset(
            "1.7b",
            _talker(2048, 28, 16, 8, 128, 6144, 2048, _predictor(1024, 5, 16, 8, 128, 3072), [24, 20, 20]),
            _REAL_DECODER,
            "Qwen3-TTS-12Hz-1.7B configuration, seeded random weights",
        ),
    )
}


def get_preset(name: str) -> Qwen3TTSPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise EdgexError(f"no such preset {name!r} for qwen3-tts (known: {', '.join(PRESETS)})") from None
