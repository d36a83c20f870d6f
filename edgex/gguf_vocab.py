"""A checkpoint's tokenizer and sampling defaults in its GGUF, as llama.cpp's converter writes them.

llama.cpp's own tools look tokens up by name and tokenize text with the file's vocabulary, so a
checkpoint that ships a byte-level BPE tokenizer (`tokenizer.json`, or `vocab.json` + `merges.txt`)
gets, through gguf-py's own readers and writer methods:

- `tokenizer.ggml.model = gpt2`, `tokenizer.ggml.tokens` in id order (gguf-py's `BpeVocab`), ids the
  tokenizer lacks up to the model's vocabulary named `[PAD<id>]`, as the converter names them;
- `tokenizer.ggml.token_type`: normal; control for special added tokens; user-defined for other
  added tokens and the padding ids;
- the merges, the bos / eos / pad / unk ids, add-bos / add-eos flags and chat template (gguf-py's
  `SpecialVocab`, reading `tokenizer.json`, `tokenizer_config.json` and `config.json` as the
  converter does);
- `tokenizer.ggml.pre`: llama.cpp's name for the tokenizer's pre-tokenizer regex (the converter
  finds it by hashing a tokenization; here it is read from `tokenizer.json`, or from
  `tokenizer_config.json`'s `tokenizer_class` for the vocab.json layout);
- `general.sampling.*` from `generation_config.json` (gguf-py's `Metadata`, the converter's reader:
  `temperature`, `top_k`, `top_p`, `min_p` of a Hugging Face generation config arrive; its
  `repetition_penalty` does not, the reader taking that field only as llama.cpp's `penalty_repeat`).

A checkpoint without tokenizer files keeps llama.cpp's `none` vocabulary (it runs from token ids).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import EdgexError

TOKENIZER_FILES = ("tokenizer.json", "vocab.json")

_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_QWEN2_REGEX = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# pre-tokenizer regexes -> llama.cpp's `tokenizer.ggml.pre` names (src/llama-vocab.cpp)
PRE_BY_REGEX = {(_QWEN2_REGEX,): "qwen2", (_GPT2_REGEX,): "gpt-2"}
PRE_BY_CLASS = {"Qwen2Tokenizer": "qwen2", "GPT2Tokenizer": "gpt-2"}


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EdgexError(f"tokenizer file {path} is not readable JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def _regexes(pre: dict | None) -> list[str]:
    """The split regexes of a `tokenizers` pre-tokenizer, in order (ByteLevel's own is GPT-2's)."""
    if not pre:
        return []
    kind = pre.get("type")
    if kind == "Sequence":
        return [r for p in pre.get("pretokenizers", []) for r in _regexes(p)]
    if kind == "Split":
        return [pre.get("pattern", {}).get("Regex") or pre.get("pattern", {}).get("String", "")]
    if kind == "ByteLevel":
        return [_GPT2_REGEX] if pre.get("use_regex", True) else []
    raise EdgexError(f"tokenizer pre-tokenizer {kind!r} has no llama.cpp equivalent edgex knows (Split, ByteLevel)")


def pre_tokenizer(folder: Path) -> str:
    """llama.cpp's `tokenizer.ggml.pre` for the checkpoint's tokenizer."""
    if (folder / "tokenizer.json").is_file():
        regexes = tuple(_regexes(_read_json(folder / "tokenizer.json").get("pre_tokenizer")))
        if regexes in PRE_BY_REGEX:
            return PRE_BY_REGEX[regexes]
        raise EdgexError(f"{folder / 'tokenizer.json'}: pre-tokenizer regex {list(regexes)} is not one llama.cpp names "
                         f"(known: {', '.join(PRE_BY_REGEX.values())})")
    cls = _read_json(folder / "tokenizer_config.json").get("tokenizer_class") if (folder / "tokenizer_config.json").is_file() else None
    if cls in PRE_BY_CLASS:
        return PRE_BY_CLASS[cls]
    raise EdgexError(f"{folder}: vocab.json without tokenizer.json and tokenizer_class {cls!r}: its pre-tokenizer is unknown "
                     f"(known classes: {', '.join(PRE_BY_CLASS)})")


def _special_flags(folder: Path) -> dict[str, bool]:
    """Added token -> whether it is special (tokenizer.json's `added_tokens`, tokenizer_config.json's
    `added_tokens_decoder`); a token neither names is special, as gguf-py's BpeVocab takes it."""
    flags = {}
    if (folder / "tokenizer_config.json").is_file():
        decoder = _read_json(folder / "tokenizer_config.json").get("added_tokens_decoder") or {}
        flags |= {t["content"]: bool(t.get("special", True)) for t in decoder.values() if isinstance(t, dict) and "content" in t}
    if (folder / "tokenizer.json").is_file():
        added = _read_json(folder / "tokenizer.json").get("added_tokens") or []
        flags |= {t["content"]: bool(t.get("special", True)) for t in added if isinstance(t, dict) and "content" in t}
    return flags


@dataclass(frozen=True)
class GgufVocab:
    """The tokenizer and sampling defaults of one checkpoint folder, for a model of `n_vocab` rows."""

    folder: Path
    n_vocab: int
    # names of the model's last rows past its text vocabulary (control tokens), as its converter names them
    named_rows: tuple[str, ...] = ()

    def tokens(self) -> tuple[list[str], list[int]]:
        """(token texts, token types) for ids 0 .. n_vocab - 1."""
        import gguf

        try:
            vocab = gguf.vocab.BpeVocab(self.folder)
        except (FileNotFoundError, ValueError, KeyError, TypeError) as exc:
            raise EdgexError(f"tokenizer in {self.folder} is not a byte-level BPE tokenizer llama.cpp reads as gpt2: {exc}") from None
        text_rows = self.n_vocab - len(self.named_rows)
        if vocab.vocab_size > text_rows:
            raise EdgexError(f"tokenizer in {self.folder} has {vocab.vocab_size} tokens, the model's text vocabulary {text_rows}")
        special = _special_flags(self.folder)
        kinds = gguf.TokenType
        texts, types = [], []
        for text, _score, kind in vocab.all_tokens():
            text = text.decode("utf-8") if isinstance(text, bytes) else text
            if kind == kinds.CONTROL and not special.get(text, True):
                kind = kinds.USER_DEFINED
            texts.append(text)
            types.append(int(kind))
        for i in range(len(texts), text_rows):
            texts.append(f"[PAD{i}]")
            types.append(int(kinds.USER_DEFINED))
        texts += self.named_rows
        types += [int(kinds.CONTROL)] * len(self.named_rows)
        return texts, types

    def sampling(self) -> dict[str, object]:
        """gguf-py's `Metadata` sampling fields read from generation_config.json (those it sets)."""
        import gguf

        loaded = gguf.Metadata.load(None, self.folder)
        return {f: getattr(loaded, f) for f in vars(loaded) if f.startswith("sampling_") and getattr(loaded, f) is not None}

    def write(self, writer) -> None:
        """Add the vocabulary and sampling keys to a `gguf.GGUFWriter` with its own typed methods."""
        import gguf

        texts, types = self.tokens()
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(pre_tokenizer(self.folder))
        writer.add_token_list(texts)
        writer.add_token_types(types)
        special = gguf.SpecialVocab(self.folder, load_merges=True, n_vocab=self.n_vocab)
        if not special.merges:
            raise EdgexError(f"tokenizer in {self.folder} has no merges (tokenizer.json model.merges or merges.txt)")
        special.add_to_gguf(writer, quiet=True)
        for field, value in self.sampling().items():
            getattr(writer, f"add_{field}")(value)


def checkpoint_vocab(folder: Path | None, n_vocab: int, named_rows: tuple[str, ...] = ()) -> GgufVocab | None:
    """The checkpoint's vocabulary where its folder ships a tokenizer, else None (llama.cpp's `none`)."""
    if folder is None or not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        return None
    return GgufVocab(Path(folder), n_vocab, tuple(named_rows))
