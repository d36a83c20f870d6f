"""The eager utterance past its sampled frames: replayed codes, and a talker cache equal to the
talker run one position at a time over the same inputs."""

import torch
from transformers.cache_utils import DynamicCache

from edgex.recipes.qwen3_tts.pipeline import Utterance

PREFILL, SAMPLED, HORIZON = 16, 6, 20


def test_frames_past_the_sampled_ones_replay_them_in_one_talker_pass(tiny):
    loaded, _ = tiny
    talker = loaded.models.talker
    utt = Utterance(talker, PREFILL, SAMPLED, seed=3, horizon=HORIZON)
    plain = Utterance(talker, PREFILL, SAMPLED, seed=3)
    for f in range(SAMPLED):
        assert torch.equal(utt.frame(f)["codes"], plain.frame(f)["codes"]) and "replayed" not in utt.frame(f)
    last = utt.frame(HORIZON - 1)
    assert last["replayed"] and last["position"] == PREFILL + HORIZON - 1
    assert torch.equal(last["codes"], utt.frame((HORIZON - 1) % SAMPLED)["codes"])
    assert torch.equal(last["code0"], utt.frame((HORIZON - 1) % SAMPLED)["code0"])

    key, value = utt.cache(PREFILL + HORIZON)
    stepped = DynamicCache()
    with torch.no_grad():
        out = talker.model(inputs_embeds=utt.prefill_embeds, past_key_values=stepped, use_cache=True)
        for f in range(HORIZON):
            assert torch.allclose(utt.frame(f)["talker_hidden"], out.last_hidden_state[:, -1:], atol=1e-4), f
            out = talker.model(inputs_embeds=utt.frame(f)["next_embeds"], past_key_values=stepped, use_cache=True,
                               cache_position=torch.tensor([PREFILL + f]))
    layers = range(len(talker.model.layers))
    assert key.shape[3] == PREFILL + HORIZON
    assert torch.allclose(key, torch.stack([stepped[i][0] for i in layers]), atol=1e-4)
    assert torch.allclose(value, torch.stack([stepped[i][1] for i in layers]), atol=1e-4)


def _same(a: Utterance, b: Utterance) -> None:
    for f in range(HORIZON):
        x, y = a.frame(f), b.frame(f)
        assert x.keys() == y.keys(), f
        for name, value in x.items():
            assert torch.equal(value, y[name]) if isinstance(value, torch.Tensor) else value == y[name], (f, name)
    for got, want in zip(a.cache(PREFILL + HORIZON), b.cache(PREFILL + HORIZON)):
        assert torch.equal(got, want)
    assert torch.equal(a.prefill_embeds, b.prefill_embeds) and torch.equal(a.codes, b.codes)
    assert torch.equal(a.text_embed(HORIZON + 5), b.text_embed(HORIZON + 5))


def test_a_kept_utterance_is_the_generated_one_and_any_change_of_its_inputs_generates_again(tiny, tmp_path, monkeypatch):
    """`Utterance.kept` reads back, bit for bit, what generating gives; another seed, another weight
    or an unreadable entry is generated again, never served from the store."""
    import copy

    from edgex import eager_store

    monkeypatch.setenv("EDGEX_CACHE_DIR", str(tmp_path))
    talker = tiny[0].models.talker
    generated = Utterance(talker, PREFILL, SAMPLED, seed=3, horizon=HORIZON)
    first = Utterance.kept(talker, PREFILL, SAMPLED, seed=3, horizon=HORIZON)
    (entry,) = (tmp_path / eager_store.FOLDER).glob("*.pt")
    second = Utterance.kept(talker, PREFILL, SAMPLED, seed=3, horizon=HORIZON)
    _same(first, generated)
    _same(second, generated)

    other_seed = Utterance.kept(talker, PREFILL, SAMPLED, seed=4, horizon=HORIZON)
    assert not torch.equal(other_seed.codes, generated.codes)
    changed = copy.deepcopy(talker)
    with torch.no_grad():
        changed.code_predictor.lm_head[3].weight.mul_(-1)  # one codebook's head: only codes 4.. can move
    other_weights = Utterance.kept(changed, PREFILL, SAMPLED, seed=3, horizon=HORIZON)
    _same(other_weights, Utterance(changed, PREFILL, SAMPLED, seed=3, horizon=HORIZON))
    assert len(list((tmp_path / eager_store.FOLDER).glob("*.pt"))) == 3

    entry.write_bytes(entry.read_bytes()[:1000])  # truncated: generated again and written over
    _same(Utterance.kept(talker, PREFILL, SAMPLED, seed=3, horizon=HORIZON), generated)
    assert eager_store.load(entry.stem) is not None
