"""Eager utterances that the components' samples come from.

`HeadUtterance`: random text ids and LLM hidden states (no LLM is part of this recipe) conditioned
the official way, prefilled right-padded to the graph's chunk, then audio tokens drawn from the
reference logits at temperature 0.8 with a seeded generator, recording every decode step's input
embedding, position and the KV cache laid out in the graph's slots.
"""

from __future__ import annotations

import torch

from .presets import LLM_DIM
from .tts import MiniCPMTTSHead, decode_reference, prefill_reference

TEMPERATURE = 0.8  # the official TTSSamplingParams temperature
# Right padding of the prefill chunk in the samples (the real rows must stay exact). Pad rows repeat
# the last real row: an all-zero row has RMS 0, and fp16 RMSNorm of it is 0 * inf = NaN.
PAD_ROWS = 2


class HeadUtterance:
    @torch.no_grad()
    def __init__(self, head: MiniCPMTTSHead, prefill_len: int, slots: int, steps: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        text = prefill_len - 2 - PAD_ROWS
        text_ids = torch.randint(0, head.config["num_text_tokens"], (text,), generator=gen)
        llm_hidden = torch.randn(text, head.config["llm_dim"], generator=gen) * (LLM_DIM ** -0.5) * 8
        cond = head.condition(text_ids, llm_hidden)
        self.length = cond.shape[1]
        self.prefill_embeds = torch.cat((cond, cond[:, -1:].expand(1, PAD_ROWS, cond.shape[2])), dim=1)
        _, key, value = prefill_reference(head, self.prefill_embeds)
        self.key = torch.zeros(key.shape[:3] + (slots, key.shape[4]))
        self.value = torch.zeros_like(self.key)
        self.key[:, :, :, : self.length] = key[:, :, :, : self.length]
        self.value[:, :, :, : self.length] = value[:, :, :, : self.length]
        logits = prefill_reference(head, self.prefill_embeds)[0][:, self.length - 1]
        self.steps = []  # (inputs_embeds, position, past_key, past_value) per decode step
        for step in range(steps):
            probs = torch.softmax(logits.reshape(-1) / TEMPERATURE, dim=-1)
            token = torch.multinomial(probs, 1, generator=gen).reshape(1, 1)
            position = torch.tensor([self.length + step])
            embeds = head.code_embeds(token)
            self.steps.append((embeds, position, self.key.clone(), self.value.clone()))
            logits, k, v = decode_reference(head, embeds, position, self.key, self.value)
            self.key[:, :, :, position] = k
            self.value[:, :, :, position] = v
            logits = logits[:, -1]
