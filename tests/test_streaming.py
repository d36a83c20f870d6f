"""Exact streaming: code2latent (rolling KV) + latent2wav (receptive-field context) over a
200-frame utterance equals the full offline decode of the unmodified decoder."""

import pytest
import torch

from edgex.parity.metrics import snr_db
from edgex.recipes.qwen3_tts.recipe import STREAM_CHUNK, WINDOW_CONTEXT, WINDOW_NEW
from edgex.recipes.qwen3_tts.code2wav import Code2Latent, Latent2Wav, receptive_field_frames
from edgex.recipes.qwen3_tts.pipeline import Utterance

pytestmark = pytest.mark.xdist_group("cpu_export")  # shares the README-demo export (and its 200-frame utterance) with one worker

FRAMES = 200


def stream(decoder, codes, chunk, code2latent=None, latent2wav=None):
    """The runner loop a device would use, over the two streaming graphs (eager wrappers by
    default, or any callables with the same signature, e.g. exported artifacts)."""
    context = receptive_field_frames(decoder)
    code2latent = code2latent or Code2Latent(decoder)
    latent2wav = latent2wav or Latent2Wav(decoder, context)
    cfg = decoder.config
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
    return Utterance(loaded.models.talker, 16, FRAMES, seed=7).codes


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


def test_exported_streaming_artifacts_reproduce_the_offline_decode(tiny, utterance, cpu_export):
    """In situ: the fp32 ONNX artifacts of code2latent + latent2wav, chained chunk by chunk the way
    a device runs them, against the unmodified offline decode."""
    from edgex.parity.runtimes import RUNTIMES

    out, proc = cpu_export
    assert proc.returncode == 0, proc.stderr[-2000:]
    root = out / "qwen3-tts" / "cpu"
    ort = RUNTIMES.get("onnxruntime")

    def artifact(name):
        session = ort.load([root / f"{name}.fp32.onnx"])
        return lambda *xs: tuple(torch.from_numpy(o) for o in session.run([x.numpy() for x in xs]))

    loaded, _ = tiny
    decoder = loaded.models.decoder
    with torch.no_grad():
        offline = decoder(utterance)
    streamed = stream(decoder, utterance, STREAM_CHUNK, artifact("code2latent"), artifact("latent2wav"))
    db = snr_db(offline.numpy(), streamed.numpy())
    print(f"ONNX Runtime streaming artifacts vs offline over {FRAMES} frames: {db:.1f} dB")
    assert db >= 90.0
