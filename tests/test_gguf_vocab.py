"""A checkpoint's tokenizer in its GGUF: llama.cpp's own tokenizer (libllama through the `llama_cpp`
binding, the file loaded vocabulary-only) turns text into exactly the ids the checkpoint's
`tokenizers` tokenizer gives, and those ids back into the text; the special-token ids and the
`general.sampling.*` keys are the checkpoint's.

The checkpoint is a tiny Spark-X2.5 (the published 131072-row vocabulary) with a byte-level BPE
tokenizer trained here in Qwen2's layout (its split regex, byte-level, special tokens added after
the learned vocabulary, one non-special added token) and a generation_config.json.
"""

from __future__ import annotations

import ctypes
import json

import pytest

from edgex.errors import EdgexError
from edgex.exporters import EXPORTERS
from edgex.gguf_vocab import PRE_BY_REGEX, checkpoint_vocab
from edgex.recipes import RECIPES
from edgex.recipes.spark_x25.config import get_preset
from edgex.recipes.spark_x25.model import build
from test_spark import _write_checkpoint

QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PLAIN_ADDED = "<tts_pad>"  # an added token that is not special (llama.cpp: user-defined)
CHAT = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
GENERATION = {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.05, "repetition_penalty": 1.05}
CORPUS = ["The quick brown fox jumps over the lazy dog. It's 12:30, isn't it?", "Hello world! hello, World... 2024-06-01",
          "你好，世界。今天天气很好，我们去公园散步吧。", "语音合成模型把文字变成声音。", "こんにちは世界、カタカナとひらがな。",
          "Emoji: 😀🎉👍🏽 and 🇯🇵 flags", "def f(x):\n    return x ** 2  # square\n\n\ttabs\tand  spaces",
          "Ünïcödé àccents: café, naïve, Straße, Ελληνικά, русский текст"] * 20
STRINGS = ["Hello world", "hello   world  ", "It's what we'd've done", "The year 2024 had 366 days.",
           "你好，世界", "今天天气很好", "こんにちは", "😀🎉", "👍🏽 nice", "🇯🇵",
           "café naïve Straße", "Ελληνικά русский", "line one\nline two\r\n\n", "\ttab  and  spaces",
           "<|im_start|>user\nHi<|im_end|>", "<|endoftext|>", "say <tts_pad> twice <tts_pad>",
           "mixed 中文 and English 😀", "   leading spaces", "x=1;y=[2,3]{'k':\"v\"}"]


def _tokenizer():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(PLAIN_ADDED, special=False, normalized=False)])
    return tok


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = _write_checkpoint(tmp_path_factory.mktemp("spark") / "ckpt", build(get_preset("tiny").config, seed=3))
    tok = _tokenizer()
    tok.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "bos_token": "<|endoftext|>", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "add_bos_token": False, "chat_template": CHAT}))
    (root / "generation_config.json").write_text(json.dumps(GENERATION))
    return root, tok


def _gguf(folder, out):
    """The decode component's GGUF, written by edgex's exporter from the loaded checkpoint."""
    recipe = RECIPES.get("spark-x2.5")
    loaded = recipe.load(None, folder, 0, {"prefill": 4, "max_context": 16})
    (component,) = recipe.components(loaded, ["decode"])
    EXPORTERS.get("gguf").export(component, "f16", out)
    return out


class LlamaVocab:
    """libllama's tokenizer over a GGUF loaded vocabulary-only."""

    def __init__(self, path):
        import llama_cpp as llama

        self.llama = llama
        params = llama.llama_model_default_params()
        params.vocab_only = True
        self.model = llama.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, f"llama.cpp did not load {path}"
        self.vocab = llama.llama_model_get_vocab(self.model)

    def tokenize(self, text: str) -> list[int]:
        data = text.encode()
        buf = (self.llama.llama_token * (4 * len(data) + 8))()
        n = self.llama.llama_tokenize(self.vocab, data, len(data), buf, len(buf), False, True)
        assert n >= 0, n
        return list(buf[:n])

    def detokenize(self, ids: list[int]) -> str:
        arr = (self.llama.llama_token * len(ids))(*ids)
        buf = ctypes.create_string_buffer(64 * len(ids) + 64)
        n = self.llama.llama_detokenize(self.vocab, arr, len(ids), buf, len(buf), False, True)
        assert n >= 0, n
        return buf.raw[:n].decode()

    def close(self):
        self.llama.llama_model_free(self.model)


def test_llama_cpp_tokenizes_the_gguf_as_the_checkpoint_s_tokenizer(checkpoint, tmp_path):
    from gguf import GGUFReader, Keys

    folder, tok = checkpoint
    path = _gguf(folder, tmp_path / "decode.gguf")
    vocab = LlamaVocab(path)
    try:
        assert vocab.llama.llama_vocab_n_tokens(vocab.vocab) == get_preset("tiny").config.vocab_size
        for text in STRINGS:
            ids = tok.encode(text, add_special_tokens=False).ids
            assert vocab.tokenize(text) == ids, text
            assert vocab.detokenize(ids) == text == tok.decode(ids, skip_special_tokens=False)
        assert vocab.llama.llama_vocab_eos(vocab.vocab) == tok.token_to_id("<|im_end|>")
        assert vocab.llama.llama_vocab_bos(vocab.vocab) == tok.token_to_id("<|endoftext|>")
    finally:
        vocab.close()

    fields = GGUFReader(str(path)).fields

    def value(key):
        return fields[key].contents()

    assert value(Keys.Tokenizer.MODEL) == "gpt2" and value(Keys.Tokenizer.PRE) == "qwen2"
    assert value(Keys.Tokenizer.PAD_ID) == tok.token_to_id("<|endoftext|>")
    assert value(Keys.Tokenizer.CHAT_TEMPLATE) == CHAT
    types = value(Keys.Tokenizer.TOKEN_TYPE)
    assert types[tok.token_to_id("<|im_start|>")] == 3 and types[tok.token_to_id(PLAIN_ADDED)] == 4  # control, user-defined
    assert value(Keys.Tokenizer.LIST)[-1] == f"[PAD{get_preset('tiny').config.vocab_size - 1}]"
    sampling = {Keys.General.SAMPLING_TEMP: "temperature", Keys.General.SAMPLING_TOP_K: "top_k",
                Keys.General.SAMPLING_TOP_P: "top_p", Keys.General.SAMPLING_MIN_P: "min_p"}
    assert {k for k in fields if k.startswith("general.sampling.")} == set(sampling)
    for key, name in sampling.items():
        assert value(key) == pytest.approx(GENERATION[name], rel=1e-6), key


def test_a_wrong_pre_tokenizer_changes_llama_cpp_s_ids(checkpoint, tmp_path, monkeypatch):
    """The check can fail: the same file with GPT-2's pre-tokenizer name tokenizes some strings
    otherwise than the checkpoint's tokenizer."""
    folder, tok = checkpoint
    monkeypatch.setitem(PRE_BY_REGEX, next(k for k, v in PRE_BY_REGEX.items() if v == "qwen2"), "gpt-2")
    vocab = LlamaVocab(_gguf(folder, tmp_path / "wrong.gguf"))
    try:
        wrong = [t for t in STRINGS if vocab.tokenize(t) != tok.encode(t, add_special_tokens=False).ids]
    finally:
        vocab.close()
    assert wrong


def test_a_tokenizer_that_is_not_byte_level_bpe_is_a_one_line_error(tmp_path):
    from tokenizers import Tokenizer, models

    for model in (models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"), models.BPE({"a": 0, "b": 1, "ab": 2}, [("a", "b")])):
        Tokenizer(model).save(str(tmp_path / "tokenizer.json"))  # the BPE one has no byte-level decoder
        with pytest.raises(EdgexError, match="not a byte-level BPE tokenizer"):
            checkpoint_vocab(tmp_path, 10).tokens()
    assert checkpoint_vocab(tmp_path / "none", 10) is None  # no tokenizer files: llama.cpp's `none` vocabulary


def test_codec_rows_past_the_text_vocabulary_carry_the_converter_s_names(checkpoint, tmp_path):
    """Qwen3-TTS's talker appends its codec rows to the text rows: llama.cpp's converter names them
    `<|codec_<i>|>`, or after the talker_config key that holds the row (llama.cpp's TTS tools look
    the control rows up by these names), typed control, the text ids the tokenizer lacks `[PAD<id>]`."""
    import json

    from edgex.recipes.qwen3_tts.gguf import _checkpoint_talker_config, codec_token_names

    folder, tok = checkpoint
    talker = {"vocab_size": 12, "codec_bos_id": 9, "codec_eos_token_id": 10, "codec_language_id": {"english": 3, "german": 4},
              "spk_id": {"vivian": 11}, "spk_is_dialect": {"vivian": False}, "text_vocab_size": 700}
    (tmp_path / "config.json").write_text(json.dumps({"talker_config": talker}))
    names = codec_token_names(_checkpoint_talker_config(tmp_path), 12)
    assert names == ["<|codec_0|>", "<|codec_1|>", "<|codec_2|>", "<|codec_language_english|>", "<|codec_language_german|>",
                     "<|codec_5|>", "<|codec_6|>", "<|codec_7|>", "<|codec_8|>", "<|codec_bos|>", "<|codec_eos_token|>",
                     "<|spk_vivian|>"]
    text_rows = tok.get_vocab_size() + 5
    texts, types = checkpoint_vocab(folder, text_rows + 12, names).tokens()
    assert texts[text_rows - 1] == f"[PAD{text_rows - 1}]" and texts[text_rows:] == names
    assert set(types[text_rows:]) == {3} and types[text_rows - 1] == 4  # control; user-defined
    with pytest.raises(EdgexError, match="text vocabulary"):
        checkpoint_vocab(folder, tok.get_vocab_size() + 11, names).tokens()
