"""The Qwen3-TTS runner: what a device app does around the exported graphs to speak as the official
model speaks (`qwen-tts` 0.1.1, `Qwen3TTSForConditionalGeneration.generate`).

numpy only, so it reads as the reference for an app in any language. Graphs are callables on lists of
numpy arrays (an ONNX Runtime session's `run`, an edgex pipeline `Stage`, ...). From token ids, a
speaker, a language, an instruction and a voice prompt it

1. builds the talker prompt row by row as the official code does (`prompt`): an optional instruction
   (`<|im_start|>user\\n...<|im_end|>\\n`, text rows only), the 3 role rows (`<|im_start|>assistant\\n`,
   text rows only), the codec prefix (`nothink, think_bos, think_eos` without a language, `think,
   think_bos, LANGUAGE, think_eos` with one; a dialect speaker's dialect replaces Chinese / auto), the
   speaker row (a CustomVoice speaker's codec row, or a voice prompt's speaker embedding), `codec_pad`,
   each with `tts_pad` on the text side except the last, which carries `tts_bos`; then the text:
   streaming puts the first text token on `codec_bos` and feeds the rest (and `tts_eos`) one row per
   frame; non-streaming puts the whole text and `tts_eos` on `codec_pad` rows, then `tts_pad` on
   `codec_bos`; an in-context voice prompt puts reference + target text against `codec_bos` and the
   reference frames' code sums instead;
2. runs the prompt through `talker_prefill` (first chunk) and `talker_decode` (the rest), then per
   frame picks codebook 0 from the talker logits (`LogitsProcessor`: repetition penalty 1.05 over the
   codes generated so far, EOS masked for the first 2 frames, the top 1024 control ids but EOS
   suppressed; greedy or sampled), stops at EOS, runs the code predictor for codebooks 1-15 and
   feeds the 16 codes' embedding sum plus the next text row (or `tts_pad`) back to the talker;
3. decodes the codes with the exact streaming decoder pair (`StreamingDecoder`), or Code2Wav's
   windowed graph where the app has that one (`WindowedDecoder`: llama.cpp's libmtmd), the reference
   frames of an in-context prompt first, and cuts their share of the waveform as the official code does.

docs/runtime-contract.md describes each graph's inputs and outputs as this runner feeds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

Graph = Callable[[Sequence[np.ndarray]], list]


@dataclass(frozen=True)
class ChatTokens:
    """The chat-template token ids the official wrapper formats text with (`<|im_start|>`,
    `<|im_end|>`, `assistant`, `user`, the newline). A checkpoint's `config.json` names the first
    three (`im_start_token_id`, `im_end_token_id`, `assistant_token_id`); a re-tokenized or smaller
    text vocabulary has others, so they come from there, Qwen2's where the config names none."""

    im_start: int = 151644
    im_end: int = 151645
    assistant: int = 77091
    user: int = 872
    newline: int = 198

    @classmethod
    def from_config(cls, config: Mapping) -> "ChatTokens":
        keys = {"im_start": "im_start_token_id", "im_end": "im_end_token_id", "assistant": "assistant_token_id",
                "user": "user_token_id", "newline": "newline_token_id"}
        return cls(**{field: int(config[key]) for field, key in keys.items() if config.get(key) is not None})

    @property
    def first_special(self) -> int:
        """The lowest of the template's special ids: plain text ids lie below it (Qwen2 and Qwen3-TTS
        number their special tokens after the text vocabulary)."""
        return min(self.im_start, self.im_end)


QWEN2_CHAT = ChatTokens()
IM_START = QWEN2_CHAT.im_start  # plain Qwen2 text ids lie below it
AUDIO_CODES = 2048  # codec ids below this are audio codes; the rest are control ids
GROUPS = 16  # codebooks per frame
SAMPLES_PER_FRAME = 1920


def chat_ids(text_ids, chat: ChatTokens = QWEN2_CHAT) -> np.ndarray:
    """`<|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n` (what `generate` reads)."""
    c = chat
    return np.array([c.im_start, c.assistant, c.newline, *text_ids, c.im_end, c.newline, c.im_start, c.assistant, c.newline],
                    np.int64)


def instruct_ids(text_ids, chat: ChatTokens = QWEN2_CHAT) -> np.ndarray:
    """`<|im_start|>user\\n{instruction}<|im_end|>\\n`."""
    return np.array([chat.im_start, chat.user, chat.newline, *text_ids, chat.im_end, chat.newline], np.int64)


def reference_ids(text_ids, chat: ChatTokens = QWEN2_CHAT) -> np.ndarray:
    """`<|im_start|>assistant\\n{reference transcript}<|im_end|>\\n` (an in-context voice prompt's)."""
    return np.array([chat.im_start, chat.assistant, chat.newline, *text_ids, chat.im_end, chat.newline], np.int64)


@dataclass(frozen=True)
class Vocabulary:
    """The ids the prompt and the stop rule use, as the checkpoint's config.json holds them."""

    tts_bos: int
    tts_eos: int
    tts_pad: int
    codec_pad: int
    codec_bos: int
    codec_eos: int
    think: int
    nothink: int
    think_bos: int
    think_eos: int
    codec_vocab: int
    languages: Mapping[str, int]
    speakers: Mapping[str, int]
    dialects: Mapping[str, object]  # speaker -> dialect language name, or False

    @classmethod
    def from_config(cls, config: Mapping) -> "Vocabulary":
        """From a Qwen3-TTS config.json (`Qwen3TTSConfig`) as a dict."""
        talker = config["talker_config"]
        return cls(config.get("tts_bos_token_id", 151672), config.get("tts_eos_token_id", 151673),
                   config.get("tts_pad_token_id", 151671), talker["codec_pad_id"], talker["codec_bos_id"],
                   talker["codec_eos_token_id"], talker["codec_think_id"], talker["codec_nothink_id"],
                   talker["codec_think_bos_id"], talker["codec_think_eos_id"], talker["vocab_size"],
                   {k.lower(): v for k, v in (talker.get("codec_language_id") or {}).items()},
                   {k.lower(): v for k, v in (talker.get("spk_id") or {}).items()},
                   {k.lower(): v for k, v in (talker.get("spk_is_dialect") or {}).items()})

    @property
    def suppressed(self) -> np.ndarray:
        """The control ids generation never picks: the top 1024 of the codec vocabulary but EOS."""
        ids = np.arange(self.codec_vocab - 1024, self.codec_vocab)
        return ids[ids != self.codec_eos]


@dataclass
class Tables:
    """The embedding tables that sit beside the graphs (the graphs take embeddings, not ids).

    `text` is the talker's text embedding followed by its text projection (fc1, SiLU, fc2), computed
    for the ids asked; `codec` the talker's codec embedding (codebook 0 and the control ids);
    `predictor_codec[g]` the code predictor's table of codebook g + 1."""

    text_embedding: np.ndarray
    fc1_weight: np.ndarray
    fc1_bias: np.ndarray
    fc2_weight: np.ndarray
    fc2_bias: np.ndarray
    codec: np.ndarray
    predictor_codec: list

    @classmethod
    def from_state(cls, state: Mapping[str, np.ndarray]) -> "Tables":
        """From the checkpoint's tensors by their Hugging Face names (`talker.` prefix)."""
        f32 = lambda name: np.asarray(state[name], np.float32)  # noqa: E731
        groups = sorted(int(k.split(".")[-2]) for k in state if k.startswith("talker.code_predictor.model.codec_embedding."))
        return cls(f32("talker.model.text_embedding.weight"), f32("talker.text_projection.linear_fc1.weight"),
                   f32("talker.text_projection.linear_fc1.bias"), f32("talker.text_projection.linear_fc2.weight"),
                   f32("talker.text_projection.linear_fc2.bias"), f32("talker.model.codec_embedding.weight"),
                   [f32(f"talker.code_predictor.model.codec_embedding.{g}.weight") for g in groups])

    def text(self, ids) -> np.ndarray:
        x = self.text_embedding[np.asarray(ids, np.int64).reshape(-1)]
        x = x @ self.fc1_weight.T + self.fc1_bias
        x = x / (1.0 + np.exp(-x))
        return (x @ self.fc2_weight.T + self.fc2_bias).astype(np.float32)

    def frame_sum(self, codes) -> np.ndarray:
        """The sum of one frame's 16 code embeddings [H] (codebook 0 from the talker's table)."""
        codes = np.asarray(codes, np.int64).reshape(-1)
        total = self.codec[codes[0]].astype(np.float32)
        for g, code in enumerate(codes[1:]):
            total = total + self.predictor_codec[g][code]
        return total


@dataclass
class VoicePrompt:
    """A Base checkpoint's voice: the speaker encoder's embedding of reference audio [H] and, for
    in-context cloning, the reference audio's codes [T, 16] and its transcript (`reference_ids`).

    As a file (`save` / `load`, what `edgex voice-prompt` writes): a numpy .npz holding
    `speaker_embedding` float32 [H], and for in-context cloning `ref_codes` int64 [T, 16] and
    `ref_ids` int64 (the chat-formatted transcript)."""

    speaker_embedding: np.ndarray
    ref_codes: np.ndarray | None = None
    ref_ids: np.ndarray | None = None

    @property
    def in_context(self) -> bool:
        return self.ref_codes is not None

    def arrays(self) -> dict:
        out = {"speaker_embedding": np.asarray(self.speaker_embedding, np.float32).reshape(-1)}
        if self.in_context:
            out["ref_codes"] = np.asarray(self.ref_codes, np.int64).reshape(-1, GROUPS)
            out["ref_ids"] = np.asarray(self.ref_ids, np.int64).reshape(-1)
        return out

    def save(self, path) -> None:
        with open(path, "wb") as f:
            np.savez(f, **self.arrays())

    @classmethod
    def load(cls, path) -> "VoicePrompt":
        """A voice-prompt .npz; ValueError names what is missing or malformed."""
        try:
            data = np.load(path, allow_pickle=False)
            arrays = {k: data[k] for k in data.files}
        except (OSError, ValueError, EOFError) as exc:
            raise ValueError(f"{path} is not a voice-prompt .npz ({exc})") from None
        if "speaker_embedding" not in arrays:
            raise ValueError(f"{path} holds no speaker_embedding (has: {', '.join(arrays) or 'nothing'})")
        codes, ids = arrays.get("ref_codes"), arrays.get("ref_ids")
        if (codes is None) != (ids is None):
            raise ValueError(f"{path}: an in-context voice prompt needs both ref_codes and ref_ids")
        if codes is not None and (codes.ndim != 2 or codes.shape[1] != GROUPS or codes.min() < 0 or codes.max() >= AUDIO_CODES):
            raise ValueError(f"{path}: ref_codes must be [frames, {GROUPS}] codes below {AUDIO_CODES}, got {codes.shape}")
        return cls(arrays["speaker_embedding"].astype(np.float32).reshape(-1),
                   None if codes is None else codes.astype(np.int64), None if ids is None else ids.astype(np.int64).reshape(-1))


# The speaker encoder's input: the official log-mel spectrogram of 24 kHz audio.
MEL_RATE, MEL_FFT, MEL_HOP, MEL_BINS, MEL_FMIN, MEL_FMAX = 24000, 1024, 256, 128, 0.0, 12000.0


def _hz_to_mel(hz):
    """The Slaney mel scale: linear below 1 kHz (3 mels per 200 Hz), logarithmic above."""
    hz = np.asarray(hz, np.float64)
    log = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log, hz / (200.0 / 3))


def _mel_to_hz(mel):
    mel = np.asarray(mel, np.float64)
    return np.where(mel >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0)), mel * (200.0 / 3))


def mel_filters() -> np.ndarray:
    """The speaker encoder's mel filter bank [128, 513]: triangles on the Slaney mel scale from 0 to
    12 kHz, each scaled to unit area (2 / its width in Hz)."""
    freqs = np.arange(MEL_FFT // 2 + 1) * MEL_RATE / MEL_FFT
    edges = _mel_to_hz(np.linspace(_hz_to_mel(MEL_FMIN), _hz_to_mel(MEL_FMAX), MEL_BINS + 2))
    widths = np.diff(edges)
    ramps = edges[:, None] - freqs[None]
    lower, upper = -ramps[:-2] / widths[:-1, None], ramps[2:] / widths[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    return (weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]).astype(np.float32)


def log_mel(audio) -> np.ndarray:
    """The speaker encoder's input [1, frames, 128] from 24 kHz audio [samples]: reflect padding of
    384 samples each side, 1024-sample periodic Hann frames every 256 samples, magnitude
    sqrt(re^2 + im^2 + 1e-9), the mel filter bank, log of at least 1e-5."""
    wav = np.asarray(audio, np.float32).reshape(-1)
    pad = (MEL_FFT - MEL_HOP) // 2
    wav = np.pad(wav, pad, mode="reflect")
    count = (wav.size - MEL_FFT) // MEL_HOP + 1
    frames = wav[np.arange(MEL_FFT)[None] + MEL_HOP * np.arange(count)[:, None]]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(MEL_FFT) / MEL_FFT)
    spectrum = np.fft.rfft(frames * window, axis=-1)
    magnitude = np.sqrt(spectrum.real**2 + spectrum.imag**2 + 1e-9)
    mel = magnitude @ mel_filters().T.astype(np.float64)
    return np.log(np.maximum(mel, 1e-5)).astype(np.float32)[None]


def voice_prompt(audio, speaker_encoder: Graph, speech_encoder: Graph | None = None, ref_ids=None) -> VoicePrompt:
    """A voice prompt from 24 kHz reference audio through the exported graphs, as a device clones a
    voice: `speaker_encoder` on its log-mel spectrogram; with `ref_ids` (the transcript,
    `reference_ids`) also `speech_encoder` on the samples. Both graphs take the reference length
    they were exported for (`--set reference_frames`, 80 ms frames): the speaker encoder pools over
    every mel frame, so padding would change the embedding; record or crop to that length."""
    wav = np.asarray(audio, np.float32).reshape(-1)
    embedding = np.asarray(speaker_encoder([log_mel(wav)])[0], np.float32).reshape(-1)
    if ref_ids is None:
        return VoicePrompt(embedding)
    if speech_encoder is None:
        raise ValueError("an in-context voice prompt needs the speech_encoder graph")
    codes = np.asarray(speech_encoder([wav[None, None]])[0], np.int64)[0]  # [16, frames]
    return VoicePrompt(embedding, codes.T.copy(), np.asarray(ref_ids, np.int64))


@dataclass
class Request:
    """One utterance: `text_ids` chat-formatted (`chat_ids`), `instruct` chat-formatted
    (`instruct_ids`) or None, a CustomVoice `speaker` name or a Base `voice`."""

    text_ids: np.ndarray
    language: str = "auto"
    speaker: str | None = None
    instruct: np.ndarray | None = None
    voice: VoicePrompt | None = None
    non_streaming: bool = False


@dataclass
class Prompt:
    embeds: np.ndarray  # [P, H] the talker's prompt rows
    trailing: np.ndarray  # [N, H] text rows fed one per frame (streaming text), then `pad`
    pad: np.ndarray  # [H] tts_pad's text row
    codec_prefix: list  # the codec ids of the prefix (think / language / think_eos), for the record


def codec_prefix(request: Request, vocab: Vocabulary) -> list[int]:
    """`nothink, think_bos, think_eos`, or `think, think_bos, LANGUAGE, think_eos` when a language
    (or a dialect speaker's dialect, for Chinese and auto) is set."""
    language = request.language.lower()
    if language == "auto":
        language_id = None
    elif language in vocab.languages:
        language_id = vocab.languages[language]
    else:
        raise ValueError(f"language {request.language!r} is not in the checkpoint's codec_language_id "
                         f"(known: auto, {', '.join(vocab.languages)})")
    speaker = (request.speaker or "").lower()
    if language in ("chinese", "auto") and speaker and vocab.dialects.get(speaker):
        language_id = vocab.languages[vocab.dialects[speaker]]
    if language_id is None:
        return [vocab.nothink, vocab.think_bos, vocab.think_eos]
    return [vocab.think, vocab.think_bos, language_id, vocab.think_eos]


def _speaker_row(request: Request, vocab: Vocabulary, tables: Tables) -> np.ndarray | None:
    if request.voice is not None:
        return np.asarray(request.voice.speaker_embedding, np.float32).reshape(-1)
    if not request.speaker:
        return None
    name = request.speaker.lower()
    if name not in vocab.speakers:
        raise ValueError(f"speaker {request.speaker!r} is not in the checkpoint's spk_id (known: {', '.join(vocab.speakers) or 'none'})")
    return tables.codec[vocab.speakers[name]]


def prompt(request: Request, vocab: Vocabulary, tables: Tables) -> Prompt:
    ids = np.asarray(request.text_ids, np.int64).reshape(-1)
    bos, eos, pad = tables.text([vocab.tts_bos, vocab.tts_eos, vocab.tts_pad])
    prefix = codec_prefix(request, vocab)
    codec_rows = [tables.codec[i] for i in prefix]
    speaker = _speaker_row(request, vocab, tables)
    if speaker is not None:
        codec_rows.append(speaker)
    codec_rows += [tables.codec[vocab.codec_pad], tables.codec[vocab.codec_bos]]
    codec_rows = np.stack(codec_rows)
    text_side = np.concatenate([np.repeat(pad[None], len(codec_rows) - 2, 0), bos[None]])
    rows = [tables.text(request.instruct)] if request.instruct is not None else []
    rows += [tables.text(ids[:3]), text_side + codec_rows[:-1]]
    text, trailing = ids[3:-5], pad[None]
    voice = request.voice
    if voice is not None and voice.in_context:
        text_rows = np.concatenate([tables.text(np.concatenate([voice.ref_ids[3:-2], text])), eos[None]])
        codes = np.asarray(voice.ref_codes, np.int64)
        ref_rows = np.stack([tables.codec[vocab.codec_bos]] + [tables.frame_sum(frame) for frame in codes])
        if request.non_streaming:
            rows += [text_rows + tables.codec[vocab.codec_pad], ref_rows + pad]
        elif len(text_rows) > len(ref_rows):
            rows.append(text_rows[: len(ref_rows)] + ref_rows)
            trailing = text_rows[len(ref_rows):]
        else:
            padded = np.concatenate([text_rows, np.repeat(pad[None], len(ref_rows) - len(text_rows), 0)])
            rows.append(padded + ref_rows)
    elif request.non_streaming:
        rows += [np.concatenate([tables.text(text), eos[None]]) + tables.codec[vocab.codec_pad],
                 (pad + tables.codec[vocab.codec_bos])[None]]
    else:
        rows.append(tables.text(ids[3:4]) + codec_rows[-1:])
        trailing = np.concatenate([tables.text(ids[4:-5]), eos[None]])
    return Prompt(np.concatenate(rows).astype(np.float32), trailing.astype(np.float32), pad, prefix)


@dataclass
class Settings:
    """The official `generate` defaults; `do_sample=False` / `subtalker_dosample=False` is greedy."""

    max_new_tokens: int = 4096
    min_new_tokens: int = 2
    repetition_penalty: float = 1.05
    do_sample: bool = True
    top_k: int = 50
    top_p: float = 1.0
    temperature: float = 0.9
    subtalker_dosample: bool = True
    subtalker_top_k: int = 50
    subtalker_top_p: float = 1.0
    subtalker_temperature: float = 0.9


class LogitsProcessor:
    """Codebook-0 logits as transformers' generate processes them for the talker, in its order:
    repetition penalty (each code generated so far: negative scores x penalty, others / penalty),
    EOS at -inf before `min_new_tokens` codes, the suppressed control ids at -inf."""

    def __init__(self, vocab: Vocabulary, settings: Settings):
        self.vocab, self.settings = vocab, settings
        self.suppressed = vocab.suppressed

    def __call__(self, logits: np.ndarray, generated: Sequence[int]) -> np.ndarray:
        scores = np.array(logits, np.float32).reshape(-1)
        penalty = self.settings.repetition_penalty
        if penalty != 1.0 and len(generated):
            seen = np.unique(np.asarray(generated, np.int64))
            picked = scores[seen]
            scores[seen] = np.where(picked < 0, picked * penalty, picked / penalty)
        if len(generated) < self.settings.min_new_tokens:
            scores[self.vocab.codec_eos] = -np.inf
        scores[self.suppressed] = -np.inf
        return scores


def probabilities(scores: np.ndarray, top_k: int, top_p: float, temperature: float) -> np.ndarray:
    """The sampling distribution transformers' warpers give: temperature, then top-k, then top-p
    (the smallest set of most likely codes whose probability exceeds top_p; the best always stays)."""
    scores = np.asarray(scores, np.float64) / temperature
    if top_k and top_k < scores.size:
        kth = np.sort(scores)[-top_k]
        scores = np.where(scores < kth, -np.inf, scores)
    probs = np.exp(scores - np.max(scores))
    probs /= probs.sum()
    if top_p < 1.0:
        order = np.argsort(probs, kind="stable")
        drop = np.cumsum(probs[order]) <= 1 - top_p
        drop[-1] = False
        probs[order[drop]] = 0.0
        probs /= probs.sum()
    return probs


def pick(scores: np.ndarray, sample: bool, top_k: int, top_p: float, temperature: float, rng) -> int:
    """Greedy: the arg max. Sampled: a draw from `probabilities`."""
    if not sample:
        return int(np.argmax(scores))
    probs = probabilities(scores, top_k, top_p, temperature)
    return int(rng.choice(probs.size, p=probs))


@dataclass
class Graphs:
    """The exported graphs a runner drives (callables on numpy lists) and the shapes it sizes its
    state from (the graphs' declared inputs: the manifest's input specs)."""

    talker_prefill: Graph
    talker_decode: Graph
    prefill_len: int  # talker_prefill's chunk
    kv_shape: tuple  # talker_decode's past_key [L, 1, KV, slots, D]
    code_predictor: Graph | None = None  # the whole-frame graph, or
    code_predictor_step: Graph | None = None  # the step graph, looped 16 times a frame
    predictor_kv_shape: tuple | None = None  # code_predictor_step's past_key


@dataclass
class Utterance:
    codes: np.ndarray  # [T, 16] the frames before EOS
    stopped: bool  # EOS was picked (False: max_new_tokens ran out)
    prompt_rows: int
    code0_scores: list = field(default_factory=list)  # processed codebook-0 scores per frame (for tie checks)
    predictor_logits: list = field(default_factory=list)  # [15, 2048] per frame


class Runner:
    def __init__(self, graphs: Graphs, tables: Tables, vocab: Vocabulary):
        self.graphs, self.tables, self.vocab = graphs, tables, vocab

    def _prefill(self, embeds: np.ndarray):
        """The prompt through the graphs: its first chunk through talker_prefill (right-padded: the
        attention is causal), the rest one row at a time through talker_decode. Returns the last
        row's logits and hidden, the cache and the number of positions it holds."""
        g = self.graphs
        rows, slots = embeds.shape[0], g.kv_shape[3]
        if rows >= slots:
            raise ValueError(f"the prompt's {rows} rows do not fit the talker's {slots} KV slots")
        first = min(rows, g.prefill_len)
        chunk = np.zeros((1, g.prefill_len, embeds.shape[1]), np.float32)
        chunk[0, :first] = embeds[:first]
        logits, hidden, key, value = g.talker_prefill([chunk])
        past_key, past_value = np.zeros(g.kv_shape, np.float32), np.zeros(g.kv_shape, np.float32)
        past_key[:, :, :, :first], past_value[:, :, :, :first] = key[:, :, :, :first], value[:, :, :, :first]
        logits, hidden = logits[:, first - 1 : first], hidden[:, first - 1 : first]
        for position in range(first, rows):
            logits, hidden = self._decode(embeds[position][None, None], position, past_key, past_value)
        return logits, hidden, past_key, past_value, rows

    def _decode(self, embeds, position, past_key, past_value):
        logits, hidden, key, value = self.graphs.talker_decode(
            [np.asarray(embeds, np.float32), np.array([position], np.int64), past_key, past_value])
        past_key[:, :, :, position : position + 1] = key
        past_value[:, :, :, position : position + 1] = value
        return logits, hidden

    def _predict(self, hidden, code0: int, settings: Settings, rng):
        """Codebooks 1-15 of a frame: the frame graph (greedy: zero noise), or the step graph with
        this runner picking each code. Returns the codes [15] and their logits [15, V]."""
        g = self.graphs
        if g.code_predictor is not None and not settings.subtalker_dosample:
            noise = np.zeros((1, GROUPS - 1, AUDIO_CODES), np.float32)
            codes, logits, _ = g.code_predictor([hidden, np.array([[code0]], np.int64), noise])
            return np.asarray(codes, np.int64).reshape(-1), np.asarray(logits)[0]
        if g.code_predictor_step is None:
            raise ValueError("sampled code prediction needs the code_predictor_step graph")
        key, value = np.zeros(g.predictor_kv_shape, np.float32), np.zeros(g.predictor_kv_shape, np.float32)
        slots, code, codes, logits = g.predictor_kv_shape[3], code0, [], []
        for step in range(GROUPS):
            step_logits, new_key, new_value = g.code_predictor_step(
                [hidden, np.array([[code]], np.int64), np.array([step], np.int64), key, value])
            if step < slots:
                key[:, :, :, step : step + 1], value[:, :, :, step : step + 1] = new_key, new_value
            if step:
                scores = np.asarray(step_logits, np.float32).reshape(-1)
                logits.append(scores)
                code = pick(scores, settings.subtalker_dosample, settings.subtalker_top_k, settings.subtalker_top_p,
                            settings.subtalker_temperature, rng)
                codes.append(code)
        return np.array(codes, np.int64), np.stack(logits)

    def generate(self, request: Request, settings: Settings | None = None, rng=None) -> Utterance:
        settings = settings or Settings()
        rng = rng if rng is not None else np.random.default_rng(0)
        built = prompt(request, self.vocab, self.tables)
        logits, hidden, past_key, past_value, position = self._prefill(built.embeds)
        process = LogitsProcessor(self.vocab, settings)
        generated, frames, utt = [], [], Utterance(np.zeros((0, GROUPS), np.int64), False, built.embeds.shape[0])
        for step in range(settings.max_new_tokens):
            scores = process(np.asarray(logits).reshape(-1), generated)
            code0 = pick(scores, settings.do_sample, settings.top_k, settings.top_p, settings.temperature, rng)
            generated.append(code0)
            utt.code0_scores.append(scores)
            if code0 == self.vocab.codec_eos:
                utt.stopped = True
                break
            if step == settings.max_new_tokens - 1:  # the last code is never fed back: no frame for it
                break
            codes, frame_logits = self._predict(hidden, code0, settings, rng)
            frame = np.concatenate([[code0], codes])
            frames.append(frame)
            utt.predictor_logits.append(frame_logits)
            text = built.trailing[step] if step < len(built.trailing) else built.pad
            if position >= self.graphs.kv_shape[3]:
                raise ValueError(f"the utterance outgrew the talker's {self.graphs.kv_shape[3]} KV slots at frame {step}")
            logits, hidden = self._decode((self.tables.frame_sum(frame) + text)[None, None], position, past_key, past_value)
            position += 1
        utt.codes = np.array(frames, np.int64).reshape(-1, GROUPS)
        return utt


class StreamingDecoder:
    """The exact streaming decoder pair as a device runs it: `code2latent` over fixed chunks (rolling
    window KV and conv state fed back), `latent2wav` over its receptive field plus the chunk. A short
    last chunk is padded with code 0 and cut: both graphs are causal. Shapes come from the graphs'
    declared inputs: code2latent's codes [1, 16, chunk], conv_state, past_key; latent2wav's latent
    [1, latent, context + chunk]."""

    def __init__(self, code2latent: Graph, latent2wav: Graph, codes_shape, conv_state_shape, kv_shape, latent_shape):
        self.code2latent, self.latent2wav = code2latent, latent2wav
        self.chunk = codes_shape[-1]
        self.context = latent_shape[-1] - self.chunk
        self.state = [np.zeros(conv_state_shape, np.float32), np.zeros(kv_shape, np.float32), np.zeros(kv_shape, np.float32)]
        self.latents = np.zeros((*latent_shape[:-1], self.context), np.float32)

    def __call__(self, codes: np.ndarray) -> np.ndarray:
        """codes [1, 16, T] -> wav [1, 1, T * 1920]."""
        frames, wavs = codes.shape[-1], []
        for start in range(0, frames, self.chunk):
            chunk = np.zeros((1, codes.shape[1], self.chunk), np.int64)
            real = min(self.chunk, frames - start)
            chunk[..., :real] = codes[..., start : start + real]
            latent, *self.state = self.code2latent([chunk, np.array([start], np.int64), *self.state])
            self.latents = np.concatenate((self.latents, latent), axis=-1)[..., -(self.context + self.chunk):]
            wav = self.latent2wav([self.latents, np.array([min(start, self.context)], np.int64)])[0]
            wavs.append(wav[..., : real * SAMPLES_PER_FRAME])
        return np.concatenate(wavs, axis=-1)


class WindowedDecoder:
    """Code2Wav's windowed graph as llama.cpp's TTS decodes with it (libmtmd's Code2Wav): each chunk of
    `new` frames with up to `context` frames of codes before it, the graph returning the last `new`
    frames' samples, of which the chunk's are kept. The window is shorter at the start of an utterance
    (fewer frames before the chunk, or a chunk shorter than `new`), so the graph must take any window
    length up to `context + new` (libmtmd's does: its calls take 1..72 frames, state carried)."""

    def __init__(self, code2wav: Graph, context: int, new: int):
        self.code2wav, self.context, self.new = code2wav, context, new

    def __call__(self, codes: np.ndarray) -> np.ndarray:
        """codes [1, 16, T] -> wav [1, 1, T * 1920]."""
        frames, wavs = codes.shape[-1], []
        for start in range(0, frames, self.new):
            end = min(frames, start + self.new)
            wav = self.code2wav([codes[..., max(0, start - self.context) : end]])[0]
            wavs.append(wav[..., wav.shape[-1] - (end - start) * SAMPLES_PER_FRAME :])
        return np.concatenate(wavs, axis=-1)


def waveform(decoder: StreamingDecoder | WindowedDecoder, codes: np.ndarray, voice: VoicePrompt | None = None) -> np.ndarray:
    """The utterance's audio [samples]: an in-context prompt's reference frames are decoded first and
    their share of the waveform cut, as the official wrapper does (`ref_len / total_len`)."""
    codes = np.asarray(codes, np.int64).reshape(-1, GROUPS)
    ref = np.asarray(voice.ref_codes, np.int64) if voice is not None and voice.in_context else np.zeros((0, GROUPS), np.int64)
    total = np.concatenate([ref, codes])
    wav = decoder(total.T[None]).reshape(-1)
    cut = int(len(ref) / max(len(total), 1) * wav.shape[0])
    return wav[cut:]
