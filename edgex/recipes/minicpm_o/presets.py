"""MiniCPM-o 4.5 speech-output configurations: the released sizes and a tiny test preset.

`tts` uses `MiniCPMTTSConfig`'s names, `flow` the layout of Token2wav's `flow.yaml` (constructor
arguments of the flow model, its encoder, its CFM and its DiT estimator), `hift` the arguments
edgex passes to `HiFTGenerator` (the release builds it with its defaults: 512 base channels).
The tiny preset keeps the vocabularies (152064 text ids, 6562 audio tokens, 6561 flow tokens), the
LLM width, the 25 -> 50 Hz rates, the 3-token lookahead, the 80-bin mel, HiFT's [8, 5, 3] x hop-4
upsampling and the 10-step cosine CFM, and shrinks only widths and depths.

Token ids: `audio_bos_token_id` / `text_eos_token_id` of the release are in its config.json, which
is not reachable here; the presets use ids in range and `--checkpoint` reads the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...errors import EdgexError

NUM_AUDIO_TOKENS = 6562  # 6561 S3 tokens at 25 Hz + EOS 6561
TEXT_VOCAB = 152064
LLM_DIM = 4096


@dataclass(frozen=True)
class MiniCPMOPreset:
    name: str
    tts: dict
    flow: dict
    hift: dict
    description: str


def _tts(hidden, layers, heads, mlp):
    return dict(
        hidden_size=hidden, intermediate_size=mlp, num_attention_heads=heads, num_key_value_heads=heads,
        num_hidden_layers=layers, max_position_embeddings=4096, num_audio_tokens=NUM_AUDIO_TOKENS,
        num_text_tokens=TEXT_VOCAB, llm_dim=LLM_DIM, num_vq=1, projector_type="mlp",
        normalize_projected_hidden=True, audio_bos_token_id=151687, text_eos_token_id=151692,
    )


def _flow(width, heads, blocks, up_blocks, units, dit_depth, dit_hidden, dit_heads, dit_head_dim):
    return dict(
        input_size=width, output_size=80, spk_embed_dim=192, output_type="mel", vocab_size=6561,
        encoder=dict(
            input_size=width, output_size=width, input_layer="linear", pre_lookahead_len=3, num_blocks=blocks,
            num_up_blocks=up_blocks, up_stride=2, up_scale_factor=2, attention_heads=heads,
            pos_enc_layer_type="rel_pos_espnet", selfattention_layer_type="rel_selfattn", key_bias=True,
            linear_units=units, dropout_rate=0.1, positional_dropout_rate=0.1, attention_dropout_rate=0.1,
            normalize_before=True,
        ),
        decoder=dict(
            inference_cfg_rate=0.7,
            estimator=dict(in_channels=320, out_channels=80, mlp_ratio=4.0, depth=dit_depth, num_heads=dit_heads,
                           head_dim=dit_head_dim, hidden_size=dit_hidden),
        ),
    )


PRESETS: dict[str, MiniCPMOPreset] = {
    p.name: p
    for p in (
        MiniCPMOPreset(
            "tiny",
            _tts(64, 2, 4, 128),
            _flow(64, 2, 2, 2, 128, 2, 64, 2, 32),
            dict(base_channels=32, f0_channels=32),
            "real vocabularies, rates and interfaces; 2-layer head, encoder and DiT, 32-channel HiFT",
        ),
        MiniCPMOPreset(
            "4.5",
            _tts(768, 20, 12, 3072),
            _flow(512, 8, 6, 4, 2048, 16, 512, 8, 64),
            dict(base_channels=512, f0_channels=512),
            "MiniCPM-o 4.5 TTS head + Token2wav at the released sizes (0.52B parameters), seeded random weights",
        ),
    )
}


def get_preset(name: str) -> MiniCPMOPreset:
    try:
        return PRESETS[name]
    except KeyError:
        raise EdgexError(f"no such preset {name!r} for minicpm-o (known: {', '.join(PRESETS)})") from None
