"""The eager Qwen3-TTS pipeline on a synthetic utterance, with every intermediate recorded.

Component samples, calibration data and in-situ checks all come from here, so graphs are scored on
real activations (talker hidden states, sampled codes, decoder latents), not on noise. Text ids are
seeded random ids (edgex ships no tokenizer); the prompt layout follows the talker's: projected
text embeddings plus codec control embeddings, then per frame the sum of the 16 code embeddings
plus the next trailing text embedding (or the tts pad embedding once the text is used up).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from .predictor import frame_reference

AUDIO_CODES = 2048  # codec ids below this are audio; the rest are control tokens


@dataclass
class Utterance:
    prefill_embeds: torch.Tensor  # [1, P, H]
    frames: list[dict] = field(default_factory=list)  # per frame: talker input/outputs, codes, noise
    cache_key: torch.Tensor | None = None  # [L, 1, KV, P + frames, D] final talker cache
    cache_value: torch.Tensor | None = None

    @property
    def codes(self) -> torch.Tensor:
        """[1, 16, T] codes as the decoder consumes them."""
        return torch.stack([torch.cat((f["code0"], f["codes"]), dim=1)[0] for f in self.frames], dim=1)[None]


def _gumbel(shape, gen: torch.Generator, temperature: float) -> torch.Tensor:
    uniform = torch.rand(shape, generator=gen).clamp_(1e-9, 1 - 1e-9)
    return -torch.log(-torch.log(uniform)) * temperature


@torch.no_grad()
def run_utterance(talker, prefill_len: int, frames: int, seed: int, temperature: float = 1.0) -> Utterance:
    """Generate `frames` frames with the unmodified HF talker + code predictor."""
    gen = torch.Generator().manual_seed(seed)
    cfg = talker.config
    text_vocab = talker.model.text_embedding.num_embeddings
    text_ids = torch.randint(0, text_vocab, (1, prefill_len + frames // 2), generator=gen)
    text = talker.text_projection(talker.model.text_embedding(text_ids))
    codec_prompt = torch.full((1, prefill_len), cfg.codec_pad_id)
    codec_prompt[0, -1] = cfg.codec_bos_id
    prefill = text[:, :prefill_len] + talker.model.codec_embedding(codec_prompt)
    trailing = text[:, prefill_len:]
    pad_embed = talker.text_projection(talker.model.text_embedding(torch.tensor([[text_vocab - 1]])))

    utt = Utterance(prefill_embeds=prefill)
    cache = DynamicCache()
    out = talker.model(inputs_embeds=prefill, past_key_values=cache, use_cache=True)
    hidden = out.last_hidden_state[:, -1:]
    logits = talker.codec_head(hidden)
    position = prefill_len
    for f in range(frames):
        code0 = torch.argmax(logits[..., :AUDIO_CODES] + _gumbel((1, 1, AUDIO_CODES), gen, temperature), dim=-1)
        noise = _gumbel((1, 15, AUDIO_CODES), gen, temperature)
        codes, _, codec_sum = frame_reference(talker, hidden, code0, noise)
        text_part = trailing[:, f : f + 1] if f < trailing.shape[1] else pad_embed
        embeds = codec_sum + text_part
        utt.frames.append(
            dict(talker_hidden=hidden, code0=code0, noise=noise, codes=codes, next_embeds=embeds, position=position)
        )
        out = talker.model(
            inputs_embeds=embeds,
            past_key_values=cache,
            use_cache=True,
            cache_position=torch.tensor([position]),
        )
        hidden = out.last_hidden_state
        logits = talker.codec_head(hidden)
        position += 1
    layers = range(len(talker.model.layers))
    utt.cache_key = torch.stack([cache[i][0] for i in layers])
    utt.cache_value = torch.stack([cache[i][1] for i in layers])
    return utt


def padded_cache(cache: torch.Tensor, length: int, slots: int) -> torch.Tensor:
    """The first `length` positions of a cache, zero-padded to `slots` (what a runner holds)."""
    out = torch.zeros(*cache.shape[:3], slots, cache.shape[4], dtype=cache.dtype)
    out[:, :, :, :length] = cache[:, :, :, :length]
    return out
