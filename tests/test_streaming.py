"""Exact streaming: code2latent (rolling KV) + latent2wav (receptive-field context) over a
200-frame utterance equals the full offline decode of the unmodified decoder."""

import pytest
import torch

from edgex.parity.metrics import snr_db
from edgex.recipes.qwen3_tts import STREAM_CHUNK, WINDOW_CONTEXT, WINDOW_NEW
from edgex.recipes.qwen3_tts.code2wav import Code2Latent, Latent2Wav, receptive_field_frames
from edgex.recipes.qwen3_tts.pipeline import run_utterance

FRAMES = 200


def stream(decoder, codes, chunk):
    """The runner loop a device would use, over the two streaming graphs."""
    code2latent, latent2wav = Code2Latent(decoder), Latent2Wav(decoder, receptive_field_frames(decoder))
    cfg = decoder.config
    context = latent2wav.context
    conv_state = torch.zeros(1, cfg.codebook_dim, 2)
    key = torch.zeros(cfg.num_hidden_layers, 1, cfg.num_key_value_heads, cfg.sliding_window - 1, cfg.head_dim)
    value = torch.zeros_like(key)
    latents = torch.zeros(1, cfg.latent_dim, context)
    wavs = []
    with torch.no_grad():
        for start in range(0, codes.shape[-1], chunk):
            latent, conv_state, key, value = code2latent(codes[..., start : start + chunk], torch.tensor([start]), conv_state, key, value)
            latents = torch.cat((latents, latent), dim=-1)[..., -(context + chunk) :]
            wavs.append(latent2wav(latents, torch.tensor([min(start, context)]))[0])
    return torch.cat(wavs, dim=-1)


@pytest.fixture(scope="module")
def utterance(tiny):
    loaded, _ = tiny
    return run_utterance(loaded.models.talker, 16, FRAMES, seed=7).codes


def test_streaming_pair_equals_offline_decode(tiny, utterance):
    loaded, _ = tiny
    decoder = loaded.models.decoder
    codes = utterance
    assert codes.shape[-1] % STREAM_CHUNK == 0
    with torch.no_grad():
        offline = decoder(codes)
    streamed = stream(decoder, codes, STREAM_CHUNK)
    assert streamed.shape == offline.shape == (1, 1, FRAMES * 1920)
    db = snr_db(offline.numpy(), streamed.numpy())
    print(f"streaming vs offline over {FRAMES} frames: {db:.1f} dB")
    assert db >= 100.0


def test_windowed_decode_is_only_approximate(tiny, utterance):
    """The 72+25 window truncates attention history: measurably worse than the exact pair."""
    loaded, components = tiny
    decoder = loaded.models.decoder
    codes = utterance
    window = components["code2wav"].module
    ctx, new = WINDOW_CONTEXT, WINDOW_NEW
    with torch.no_grad():
        offline = decoder(codes)
        last = window(codes[..., FRAMES - ctx - new :])[0]
    db = snr_db(offline[..., -new * 1920 :].numpy(), last.numpy())
    print(f"72+25 window vs offline (last chunk of {FRAMES} frames): {db:.1f} dB")
    assert 20.0 < db < 100.0
