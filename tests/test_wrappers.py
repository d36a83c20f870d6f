"""Every export wrapper equals the unmodified qwen-tts reference in fp32 (docs/parity.md: >= 100 dB)."""

import pytest
import torch

from edgex.component import TOKENS
from edgex.parity.metrics import snr_db, token_agreement
from edgex.recipes.qwen3_tts.qwen_tts_import import qwen_tts_modules

COMPONENTS = ["talker_prefill", "talker_decode", "code_predictor", "code_predictor_step", "code2wav", "code2latent", "latent2wav"]


@pytest.mark.parametrize("name", COMPONENTS)
def test_wrapper_equals_reference(tiny, name):
    _, components = tiny
    comp = components[name]
    assert len(comp.samples) >= 2, "an example plus held-out samples from the eager pipeline"
    for sample, inputs in comp.samples.items():
        with torch.no_grad():
            got = comp.module(*inputs)
        ref = comp.reference_outputs(sample)
        assert len(got) == len(comp.outputs)
        for spec, r, g in zip(comp.outputs, ref, got):
            assert tuple(g.shape) == spec.shape, (sample, spec.name)
            if spec.kind == TOKENS:
                assert token_agreement(r.numpy(), g.numpy()) == 1.0, (sample, spec.name)
            else:
                assert snr_db(r.numpy(), g.numpy()) >= 100.0, (sample, spec.name)


def test_decoder_samples_come_from_the_eager_pipeline(tiny):
    loaded, components = tiny
    codes = components["code2wav"].example_inputs[0]
    assert codes.shape == (1, 16, 97) and int(codes.max()) < 2048
    # the predictor sample's code0 is the first code of the pipeline frame the decoder sample holds
    code0 = components["code_predictor"].samples["utterance_a_frame10_greedy"][1]
    assert int(code0) == int(codes[0, 0, 10])


def test_wav_is_speech_scale(tiny):
    _, components = tiny
    wav = components["code2wav"].reference_outputs("utterance_a_frames0_97")[0]
    rms = wav.pow(2).mean().sqrt().item()
    assert 0.01 < rms < 0.5, rms
    assert (wav.abs() >= 1).float().mean().item() < 0.01


# Bugs planted in the qwen-tts reference's own code: the graphs compute these parts themselves
# (edgex.nn.transformer, code2wav.py), so their outputs must not move while the reference's do.
def _snake_without_exp(self, x):
    return x + torch.sin(x * self.alpha[None, :, None]) ** 2 / (self.beta[None, :, None] + 1e-9)


def _codebook_off_by_one(self, codes):
    table = self.embedding_sum / self.cluster_usage.clamp(min=self.epsilon)[:, None]
    return torch.nn.functional.embedding((codes + 1) % self.codebook_size, table)


def _mlp_with_gelu(self, x):
    return self.down_proj(torch.nn.functional.gelu(self.gate_proj(x)) * self.up_proj(x))


def _decoder_bugs():
    tok = qwen_tts_modules().tokenizer_modeling
    return {
        "snake without exp": (tok.SnakeBeta, "forward", _snake_without_exp),
        "layer scale dropped": (tok.Qwen3TTSTokenizerV2DecoderLayerScale, "forward", lambda self, x: x),
        "codebook off by one": (tok.EuclideanCodebook, "decode", _codebook_off_by_one),
        "mlp gelu for silu": (tok.Qwen3TTSTokenizerV2DecoderMlp, "forward", _mlp_with_gelu),
    }


@pytest.mark.parametrize("bug", ["snake without exp", "layer scale dropped", "codebook off by one", "mlp gelu for silu"])
def test_decoder_graph_shares_no_numerical_code_with_the_reference(tiny, monkeypatch, bug):
    comp = tiny[1]["code2wav"]
    inputs = comp.example_inputs
    with torch.no_grad():
        clean = comp.module(*inputs)
        monkeypatch.setattr(*_decoder_bugs()[bug])
        graph = comp.module(*inputs)
        reference = comp.reference(*inputs)
    assert all(torch.equal(a, b) for a, b in zip(clean, graph)), "the graph's numbers depend on the reference's code"
    assert snr_db(reference[0].numpy(), graph[0].numpy()) < 90.0, "the planted bug must show in the wav"


def test_talker_rope_frequencies_come_from_the_config_not_the_reference(tiny, monkeypatch):
    """An HF RoPE-init bug (half the frequencies in the reference's rotary buffer): a talker graph
    built afterwards is bit-identical to the one built before, and the reference moves away."""
    loaded, components = tiny
    talker, comp = loaded.models.talker, components["talker_decode"]
    rotary = talker.model.rotary_emb
    monkeypatch.setattr(rotary, "inv_freq", rotary.inv_freq * 0.5)
    with torch.no_grad():
        clean = comp.module(*comp.example_inputs)
        graph = type(comp.module)(talker, comp.example_inputs[2].shape[3])(*comp.example_inputs)  # positions: the KV slots
        reference = comp.reference(*comp.example_inputs)
    assert all(torch.equal(a, b) for a, b in zip(clean, graph))
    assert snr_db(reference[0].numpy(), graph[0].numpy()) < 90.0
