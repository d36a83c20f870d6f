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
