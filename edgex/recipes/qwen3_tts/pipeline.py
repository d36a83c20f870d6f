"""The eager Qwen3-TTS pipeline on a synthetic utterance, with every intermediate recorded.

Component samples, calibration data and in-situ checks all come from here, so graphs are scored on
real activations (talker hidden states, sampled codes, decoder latents), not on noise. Text ids are
seeded random ids (edgex ships no tokenizer); the prompt layout follows the talker's: projected
text embeddings plus codec control embeddings, then per frame the sum of the 16 code embeddings
plus the next trailing text embedding (or the tts pad embedding once the text is used up).

Frames are generated on demand: the talker and predictor samples sit in the first ~40 frames, and
only the decoder windows need all of them (generating 100 frames of the 0.6b talker takes minutes).
The random draws are consumed in frame order, so a frame is the same however far generation went.

Past the decoder's frames, up to a talker's last KV slot (`horizon`), the utterance replays its own
frames: frame f takes the codes of frame f mod `frames` plus its own text embedding, and the talker
computes those positions' keys, values and hidden states in one pass over the cache. The talker
decode samples there exist for their position (the most RoPE rotation, the longest attention),
which a replay gives for a single talker pass instead of sampling every frame through the 15-step
predictor (224 frames of the 0.6b model: 2-3 minutes). Replayed frames are marked `replayed` and
carry no sampling noise.

`Utterance.kept` is the utterance the recipe samples from: generated to its horizon once and kept in
the eager store (`edgex.eager_store`), so later exports, verifies and sweep points of the same talker
read it back instead of generating it again; one too large to keep is generated on demand as above.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache

from ... import eager_store
from .predictor import frame_reference

AUDIO_CODES = 2048  # codec ids below this are audio; the rest are control tokens


def _gumbel(shape, gen: torch.Generator, temperature: float) -> torch.Tensor:
    uniform = torch.rand(shape, generator=gen).clamp_(1e-9, 1 - 1e-9)
    return -torch.log(-torch.log(uniform)) * temperature


class Utterance:
    """Up to `frames` frames of the unmodified HF talker + code predictor, generated lazily, then
    replayed frames up to `horizon` (module doc).

    `prefill_embeds` [1, P, H]; `frame(f)` is frame f's record (talker input/outputs, codes, noise,
    position); `cache(n)` the talker cache's first n positions [L, 1, KV, n, D]; `codes` [1, 16, T]
    the whole utterance's codes as the decoder consumes them."""

    def __init__(self, talker, prefill_len: int, frames: int, seed: int, temperature: float = 1.0, horizon: int | None = None):
        """`horizon`: how many frames `frame` may generate (default `frames`, the length of `codes`):
        a talker with more KV slots is sampled up to its last slot, past the decoder's frames."""
        self._talker, self._length, self._temperature = talker, frames, temperature
        self._horizon = max(frames, horizon or 0)
        self._gen = torch.Generator().manual_seed(seed)
        cfg = talker.config
        text_vocab = talker.model.text_embedding.num_embeddings
        with torch.no_grad():
            text_ids = torch.randint(0, text_vocab, (1, prefill_len + frames // 2), generator=self._gen)
            text = talker.text_projection(talker.model.text_embedding(text_ids))
            codec_prompt = torch.full((1, prefill_len), cfg.codec_pad_id)
            codec_prompt[0, -1] = cfg.codec_bos_id
            self.prefill_embeds = text[:, :prefill_len] + talker.model.codec_embedding(codec_prompt)
            self._trailing = text[:, prefill_len:]
            self._pad_embed = talker.text_projection(talker.model.text_embedding(torch.tensor([[text_vocab - 1]])))
            self._cache = DynamicCache()
            out = talker.model(inputs_embeds=self.prefill_embeds, past_key_values=self._cache, use_cache=True)
        self._hidden = out.last_hidden_state[:, -1:]
        self._position = prefill_len
        self._frames: list[dict] = []

    @classmethod
    def kept(cls, talker, prefill_len: int, frames: int, seed: int, temperature: float = 1.0,
             horizon: int | None = None) -> "Utterance":
        """The utterance generated to its horizon, read from the eager store where an earlier run
        kept it (module doc); a generated one is kept for the next. A hit and a miss give the same
        tensors: both return what the store holds."""
        length = max(frames, horizon or 0)
        if _state_bytes(talker, prefill_len, frames, length) > eager_store.MAX_BYTES:
            return cls(talker, prefill_len, frames, seed, temperature, horizon)
        inputs = {"talker": eager_store.module_digest(talker), "prefill_len": prefill_len, "frames": frames, "seed": seed,
                  "temperature": temperature, "horizon": length}
        key = eager_store.entry_key("qwen3-tts utterance", inputs, ("transformers", "qwen-tts"))

        def generate() -> dict:
            utt = cls(talker, prefill_len, frames, seed, temperature, horizon)
            utt.frame(length - 1)
            return utt._state()

        return cls._from_state(talker, frames, temperature, eager_store.stored(key, generate))

    def _state(self) -> dict:
        layers = range(len(self._talker.model.layers))
        return {"prefill_embeds": self.prefill_embeds, "trailing": self._trailing, "pad_embed": self._pad_embed,
                "hidden": self._hidden, "position": self._position, "horizon": self._horizon, "frames": self._frames,
                "keys": [self._cache[i][0] for i in layers], "values": [self._cache[i][1] for i in layers]}

    @classmethod
    def _from_state(cls, talker, frames: int, temperature: float, state: dict) -> "Utterance":
        utt = cls.__new__(cls)
        utt._talker, utt._length, utt._temperature, utt._gen = talker, frames, temperature, None
        utt._horizon, utt._position, utt._hidden = state["horizon"], state["position"], state["hidden"]
        utt.prefill_embeds, utt._trailing, utt._pad_embed = state["prefill_embeds"], state["trailing"], state["pad_embed"]
        utt._frames = list(state["frames"])
        utt._cache = DynamicCache()
        for i, (key, value) in enumerate(zip(state["keys"], state["values"])):
            utt._cache.update(key, value, i)
        return utt

    def frame(self, index: int) -> dict:
        if not 0 <= index < self._horizon:
            raise IndexError(f"frame {index} outside the utterance's {self._horizon} frames")
        while len(self._frames) <= index:
            self._extend()
        return self._frames[index]

    def cache(self, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        while self._cache.get_seq_length() < length:
            self._extend()
        layers = range(len(self._talker.model.layers))
        return (torch.stack([self._cache[i][0][:, :, :length] for i in layers]),
                torch.stack([self._cache[i][1][:, :, :length] for i in layers]))

    @property
    def codes(self) -> torch.Tensor:
        frames = [self.frame(f) for f in range(self._length)]
        return torch.stack([torch.cat((f["code0"], f["codes"]), dim=1)[0] for f in frames], dim=1)[None]

    def text_embed(self, frame: int) -> torch.Tensor:
        """The text part of the talker input after frame `frame`: the next trailing text embedding, or
        the tts pad embedding once the text is used up (a runner adds it to the frame's code embeds)."""
        return self._trailing[:, frame : frame + 1] if frame < self._trailing.shape[1] else self._pad_embed

    def _extend(self) -> None:
        if len(self._frames) < self._length:
            self._step()
        elif len(self._frames) < self._horizon:
            self._replay()
        else:
            raise IndexError(f"the utterance's {self._horizon} frames are all generated")

    @torch.no_grad()
    def _replay(self) -> None:
        """Every frame from here to the horizon, replaying the sampled ones (module doc)."""
        start = len(self._frames)
        frames = []
        for f in range(start, self._horizon):
            source = self._frames[f % self._length]
            frames.append(dict(code0=source["code0"], codes=source["codes"], codec_sum=source["codec_sum"],
                               next_embeds=source["codec_sum"] + self.text_embed(f), position=self._position + f - start,
                               replayed=True))
        embeds = torch.cat([f["next_embeds"] for f in frames], dim=1)
        positions = torch.arange(self._position, self._position + len(frames))
        out = self._talker.model(inputs_embeds=embeds, past_key_values=self._cache, use_cache=True, cache_position=positions)
        hiddens = torch.cat((self._hidden, out.last_hidden_state[:, :-1]), dim=1)
        for i, record in enumerate(frames):
            self._frames.append({"talker_hidden": hiddens[:, i : i + 1], **record})
        self._hidden = out.last_hidden_state[:, -1:]
        self._position += len(frames)

    @torch.no_grad()
    def _step(self) -> None:
        talker, gen, temperature = self._talker, self._gen, self._temperature
        f, hidden = len(self._frames), self._hidden
        logits = talker.codec_head(hidden)
        code0_noise = _gumbel((1, 1, AUDIO_CODES), gen, temperature)
        code0 = torch.argmax(logits[..., :AUDIO_CODES] + code0_noise, dim=-1)
        noise = _gumbel((1, 15, AUDIO_CODES), gen, temperature)
        codes, _, codec_sum = frame_reference(talker, hidden, code0, noise)
        embeds = codec_sum + self.text_embed(f)
        self._frames.append(dict(talker_hidden=hidden, code0=code0, code0_noise=code0_noise, noise=noise, codes=codes,
                                 codec_sum=codec_sum, next_embeds=embeds, position=self._position))
        out = talker.model(inputs_embeds=embeds, past_key_values=self._cache, use_cache=True,
                           cache_position=torch.tensor([self._position]))
        self._hidden = out.last_hidden_state
        self._position += 1


def _state_bytes(talker, prefill_len: int, frames: int, horizon: int) -> int:
    """What a kept utterance's state takes: the talker cache at its horizon and each sampled frame's noise."""
    cfg = talker.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (prefill_len + horizon) * head_dim
    return 4 * (cache + frames * 16 * AUDIO_CODES + horizon * 4 * cfg.hidden_size)


def padded_cache(cache: torch.Tensor, slots: int) -> torch.Tensor:
    """A cache's positions zero-padded to `slots` (what a runner holds)."""
    out = torch.zeros(*cache.shape[:3], slots, cache.shape[4], dtype=cache.dtype)
    out[:, :, :, : cache.shape[3]] = cache
    return out
