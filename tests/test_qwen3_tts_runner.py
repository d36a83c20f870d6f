"""The Qwen3-TTS runner's prompt and logits processing against the official code, no export needed.

Every published variant and request kind: the talker prompt the runner builds (`runner.prompt`) must
be the one the official `generate()` hands its talker (captured at the talker's first call), row for
row, and the trailing text rows too. The codebook-0 processing and the sampling distribution must be
transformers' processors and warpers with the official arguments."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgex.parity.metrics import snr_db
from edgex.recipes.qwen3_tts import official as off
from edgex.recipes.qwen3_tts import runner as rn
from edgex.recipes.qwen3_tts.utterance import default_request, tables


@pytest.fixture(scope="module")
def models():
    """The CustomVoice model, and Base and VoiceDesign wrapped around the same talker (their config's
    tables and `tts_model_type`: generate() reads only the talker and the config)."""
    custom = off.build("custom_voice", seed=0)
    config = custom.model.config.to_dict()
    out = {"custom_voice": (custom, config)}
    for variant in ("base", "voice_design"):
        cfg = {**config, "tts_model_type": variant, "talker_config": {**config["talker_config"], **off.VARIANTS[variant]}}
        out[variant] = (off.wrap(custom.model.talker, custom.decoder, cfg), cfg)
    return out


def _official_prompt(model, request):
    """The inputs_embeds and trailing text rows the official generate() gives its talker."""
    seen = {}

    def capture(_module, _args, kwargs):
        if not seen:  # the prefill call; the later ones feed codes
            seen.update(embeds=kwargs["inputs_embeds"][0].numpy().copy(), trailing=kwargs["trailing_text_hidden"][0].numpy().copy())

    handle = model.model.talker.register_forward_pre_hook(capture, with_kwargs=True)
    try:
        off.official_run(model, request, rn.Settings(max_new_tokens=2, do_sample=False, subtalker_dosample=False))
    finally:
        handle.remove()
    return seen["embeds"], seen["trailing"]


def _requests(variant, config):
    rng = np.random.default_rng(3)
    text = rn.chat_ids(rng.integers(0, rn.IM_START, 9))
    default = default_request(config, 0)
    out = {"default": default, "non-streaming": rn.Request(**{**default.__dict__, "non_streaming": True})}
    if variant == "custom_voice":
        out |= {"dialect via auto": rn.Request(text, "auto", "eric"), "dialect via chinese": rn.Request(text, "chinese", "dylan"),
                "auto": rn.Request(text, "auto", "ryan"), "instruct": rn.Request(text, "english", "vivian", rn.instruct_ids([5, 6, 7]))}
    elif variant == "base":
        embedding = default.voice.speaker_embedding
        ref = rn.reference_ids(rng.integers(0, rn.IM_START, 4))
        for frames in (4, 20):  # reference shorter / longer than the text
            voice = rn.VoicePrompt(embedding, rng.integers(0, rn.AUDIO_CODES, (frames, rn.GROUPS)), ref)
            out[f"in-context {frames}"] = rn.Request(text, "english", voice=voice)
            out[f"in-context {frames}, non-streaming"] = rn.Request(text, "english", voice=voice, non_streaming=True)
    else:
        out["auto"] = rn.Request(text, "auto", instruct=default.instruct)
    return out


@pytest.mark.parametrize("variant", list(off.VARIANTS))
def test_the_runner_builds_the_official_prompt_for_every_request_kind(models, variant):
    model, config = models[variant]
    vocab, table = rn.Vocabulary.from_config(config), tables(model.model.talker)
    for name, request in _requests(variant, config).items():
        embeds, trailing = _official_prompt(model, request)
        built = rn.prompt(request, vocab, table)
        assert built.embeds.shape == embeds.shape, name
        assert snr_db(embeds, built.embeds) > 100, name
        assert built.trailing.shape == trailing.shape and snr_db(trailing, built.trailing) > 100, name


def test_a_prompt_without_the_language_row_is_not_the_official_one(models, monkeypatch):
    model, config = models["custom_voice"]
    request = default_request(config, 0)
    embeds, _ = _official_prompt(model, request)
    original = rn.codec_prefix
    monkeypatch.setattr(rn, "codec_prefix", lambda r, v: [i for i in original(r, v) if i not in v.languages.values()])
    assert rn.prompt(request, rn.Vocabulary.from_config(config), tables(model.model.talker)).embeds.shape[0] == embeds.shape[0] - 1


def test_codebook0_processing_and_sampling_are_transformers_with_the_official_arguments():
    from transformers.generation.logits_process import (LogitsProcessorList, MinNewTokensLengthLogitsProcessor,
                                                        RepetitionPenaltyLogitsProcessor, SuppressTokensLogitsProcessor,
                                                        TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

    vocab = rn.Vocabulary.from_config(off.preset_config(dict(vocab_size=3072, codec_pad_id=2148, codec_bos_id=2149,
                                                             codec_eos_token_id=2150, codec_think_id=2154, codec_nothink_id=2155,
                                                             codec_think_bos_id=2156, codec_think_eos_id=2157)))
    settings = rn.Settings()
    suppress = [i for i in range(3072 - 1024, 3072) if i != vocab.codec_eos]  # generate()'s own list
    rng = np.random.default_rng(0)
    for history in ([], [7], [7, 7, 1500, 3, 2000, 7]):
        logits = rng.standard_normal(3072).astype(np.float32) * 3
        official = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.05),
                                        MinNewTokensLengthLogitsProcessor(0, 2, torch.tensor([vocab.codec_eos])),
                                        SuppressTokensLogitsProcessor(suppress)])
        ids = torch.tensor([history], dtype=torch.long)
        want = official(ids, torch.from_numpy(logits)[None].clone())[0].numpy()
        got = rn.LogitsProcessor(vocab, settings)(logits, history)
        np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
        np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], rtol=1e-6)
        warped = LogitsProcessorList([TemperatureLogitsWarper(0.9), TopKLogitsWarper(50), TopPLogitsWarper(0.8)])(
            ids, torch.from_numpy(want)[None].clone())
        expected = torch.softmax(warped.double(), dim=-1)[0].numpy()
        probs = rn.probabilities(got, 50, 0.8, 0.9)  # float64 here, float32 in transformers
        np.testing.assert_array_equal(probs > 0, expected > 0)
        np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-9)


# A re-tokenized checkpoint: a 4096-id text vocabulary whose config names its own chat-template and
# TTS special ids (Qwen2's 151644 ... would index past its text embedding).
SMALL_TEXT = {"talker_config": {"text_vocab_size": 4096}, "im_start_token_id": 4000, "im_end_token_id": 4001,
              "assistant_token_id": 4002, "tts_pad_token_id": 4003, "tts_bos_token_id": 4004, "tts_eos_token_id": 4005}


def test_a_checkpoint_naming_other_chat_template_ids_gets_its_own_ids_and_the_official_prompt(monkeypatch):
    from types import SimpleNamespace

    from edgex.recipes.qwen3_tts import utterance

    model = off.build("voice_design", seed=0, overrides=SMALL_TEXT)
    config = model.model.config.to_dict()
    chat = rn.ChatTokens.from_config(config)
    assert (chat.im_start, chat.im_end, chat.assistant) == (4000, 4001, 4002)
    assert (chat.user, chat.newline) == (rn.QWEN2_CHAT.user, rn.QWEN2_CHAT.newline)  # named by no config: Qwen2's
    monkeypatch.setattr(utterance, "config_of", lambda _loaded: config)  # as a checkpoint folder's config.json
    request = utterance.request_from(SimpleNamespace(source={}), {"text_ids": [11, 12, 13, 14], "instruct_ids": [5, 6]})
    np.testing.assert_array_equal(request.text_ids, [4000, 4002, 198, 11, 12, 13, 14, 4001, 198, 4000, 4002, 198])
    np.testing.assert_array_equal(request.instruct, [4000, 872, 198, 5, 6, 4001, 198])
    default = default_request(config, 0)
    assert default.text_ids.max() < 4096 and default.text_ids[0] == 4000
    vocab, table = rn.Vocabulary.from_config(config), tables(model.model.talker)
    for name, req in {"request": request, "default": default}.items():
        embeds, trailing = _official_prompt(model, req)
        built = rn.prompt(req, vocab, table)
        assert built.embeds.shape == embeds.shape and snr_db(embeds, built.embeds) > 100, name
        assert built.trailing.shape == trailing.shape and snr_db(trailing, built.trailing) > 100, name


def test_a_config_without_the_published_tables_is_a_one_line_error(models):
    """The official code reads `spk_id`, `spk_is_dialect` and `codec_language_id` from the talker config
    (a Base checkpoint's `spk_id` is `{}`): a config without one is refused in one line, not a traceback
    from inside the official constructor."""
    from edgex.errors import EdgexError

    model, config = models["custom_voice"]
    without = {**config, "talker_config": {k: v for k, v in config["talker_config"].items() if k != "spk_id"}}
    with pytest.raises(EdgexError, match="talker_config has no spk_id"):
        off.wrap(model.model.talker, model.decoder, without)
    assert off.wrap(model.model.talker, model.decoder, off.preset_config(config["talker_config"], "base")).variant == "base"
