"""Code predictor graphs: a whole frame (15 residual codebooks) and a single step.

Per 80 ms frame the predictor sees [talker hidden, embed(code 0)] and then its own previous code,
one codebook at a time, with a fresh cache of at most 16 positions. Sampling is Gumbel-max: the
graph adds the `noise` input to the logits before argmax, so zero noise is greedy decoding and the
runner owns the random source (temperature / top-k shaping happen when it draws the noise).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from ...nn.transformer import (attach_norm_constants, causal_valid, decoder_layer, group_mask, mask_from_valid, rms_norm,
                              register_rope, rope_cos_sin, rope_inv_freq, step_valid)

GROUPS = 15  # residual codebooks predicted per frame (codebooks 1..15)


class _PredictorGraph(nn.Module):
    def __init__(self, talker: nn.Module):
        super().__init__()
        predictor = talker.code_predictor
        attach_norm_constants(talker)
        self.layers = predictor.model.layers
        self.norm = predictor.model.norm
        self.project = predictor.small_to_mtp_projection
        self.heads = predictor.lm_head
        self.tables = predictor.model.codec_embedding
        self.talker_table = talker.model.codec_embedding
        config = predictor.config
        register_rope(self, "rope", rope_inv_freq(config), GROUPS + 1)  # every position of a frame
        self.groups = config.num_attention_heads // config.num_key_value_heads

    def _rope(self, positions, dtype):
        return rope_cos_sin(self, "rope", positions, dtype)

    def _layers(self, embeds, rope, past, mask):
        cos, sin = rope
        hidden, new = self.project(embeds), []
        for i, layer in enumerate(self.layers):
            pk, pv = (None, None) if past is None else past[i]
            hidden, k, v = decoder_layer(layer, hidden, cos, sin, pk, pv, mask)
            new.append((k, v))
        return rms_norm(self.norm, hidden), new


class CodePredictorFrame(_PredictorGraph):
    """talker_hidden [1, 1, H], code0 [1, 1], noise [1, 15, V] ->
    codes [1, 15], logits [1, 15, V], codec_embeds [1, 1, H] (sum of all 16 code embeddings: the
    codec part of the talker's next input)."""

    def forward(self, talker_hidden, code0, noise):
        first = self.talker_table(code0)
        embeds = torch.cat((talker_hidden, first), dim=1)
        mask = group_mask(mask_from_valid(causal_valid(2, 2), embeds.dtype)[None, None], self.groups, 2)
        cos, sin = self._rope(torch.arange(GROUPS + 1), embeds.dtype)  # every position of the frame, once
        hidden, past = self._layers(embeds, (cos[:, :, :2], sin[:, :, :2]), None, mask)
        codes, logits, codec_sum = [], [], first
        last = hidden[:, -1:]
        for g in range(GROUPS):
            step_logits = self.heads[g](last)
            code = torch.argmax(step_logits + noise[:, g : g + 1], dim=-1)
            codes.append(code)
            logits.append(step_logits)
            embed = self.tables[g](code)
            codec_sum = codec_sum + embed
            if g + 1 < GROUPS:
                rope = (cos[:, :, g + 2 : g + 3], sin[:, :, g + 2 : g + 3])
                last, new = self._layers(embed, rope, past, None)
                past = [
                    (torch.cat((pk, k), dim=2), torch.cat((pv, v), dim=2)) for (pk, pv), (k, v) in zip(past, new)
                ]
        return torch.cat(codes, dim=1), torch.cat(logits, dim=1), codec_sum


class CodePredictorStep(_PredictorGraph):
    """One position of the frame loop (the fallback when a whole-frame graph is too large).

    step 0 feeds talker_hidden; step s >= 1 feeds `code` (= code s-1, embedded with the matching
    table) and returns the logits of code s. past_key/value hold up to 15 positions; slots >= step
    are ignored. Outputs logits [1, 1, V] and this position's key/value [L, 1, KV, 1, D]."""

    def __init__(self, talker: nn.Module):
        super().__init__(talker)
        vocab = self.heads[0].weight.shape[0]
        tables = [self.talker_table.weight[:vocab]] + [t.weight for t in self.tables[: GROUPS - 1]]
        self.register_buffer("stacked_tables", torch.cat(tables).detach().clone(), persistent=False)
        self.register_buffer(
            "stacked_heads", torch.stack([h.weight for h in self.heads]).detach().clone(), persistent=False
        )
        self.vocab = vocab

    def forward(self, talker_hidden, code, step, past_key, past_value):
        row = (torch.clamp(step - 1, min=0) * self.vocab + code.reshape(-1)).reshape(1, 1)
        embedded = nn.functional.embedding(row, self.stacked_tables)
        embeds = torch.where(step.reshape(1, 1, 1) == 0, talker_hidden, embedded)
        slots = past_key.shape[3]
        valid = step_valid(slots, step)
        mask = mask_from_valid(valid, embeds.dtype)[None, None, None]
        past = [(past_key[i], past_value[i]) for i in range(past_key.shape[0])]
        hidden, new = self._layers(embeds, self._rope(step, embeds.dtype), past, mask)
        head = torch.index_select(self.stacked_heads, 0, torch.clamp(step - 1, min=0))[0]
        logits = torch.matmul(hidden, head.transpose(0, 1))
        return logits, torch.stack([k for k, _ in new]), torch.stack([v for _, v in new])


def _embed(talker, step: int, code: torch.Tensor, talker_hidden: torch.Tensor) -> torch.Tensor:
    if step == 0:
        return talker_hidden
    if step == 1:
        return talker.model.codec_embedding(code)
    return talker.code_predictor.model.codec_embedding[step - 2](code)


@torch.no_grad()
def frame_reference(talker, talker_hidden, code0, noise, forced_codes: torch.Tensor | None = None):
    """The unmodified HF code predictor, driven the way the talker's generate drives it. With
    `forced_codes` [1, 15] it is teacher-forced: those codes are fed back (and returned) instead of its
    own samples, so an artifact's logits can be compared on the artifact's own history."""
    predictor = talker.code_predictor
    cache = DynamicCache()
    first = talker.model.codec_embedding(code0)
    out = predictor(inputs_embeds=torch.cat((talker_hidden, first), dim=1), past_key_values=cache, use_cache=True)
    codes, logits, codec_sum = [], [], first
    for g in range(GROUPS):
        step_logits = out.logits[:, -1:]
        code = torch.argmax(step_logits + noise[:, g : g + 1], dim=-1) if forced_codes is None else forced_codes[:, g : g + 1]
        codes.append(code)
        logits.append(step_logits)
        codec_sum = codec_sum + predictor.model.codec_embedding[g](code)
        if g + 1 < GROUPS:
            out = predictor(
                input_ids=code, past_key_values=cache, use_cache=True, generation_steps=out.generation_steps
            )
    return torch.cat(codes, dim=1), torch.cat(logits, dim=1), codec_sum


@torch.no_grad()
def step_reference(talker, talker_hidden, code, step, past_key, past_value):
    predictor = talker.code_predictor
    s = int(step.reshape(-1)[0])
    cache = DynamicCache()
    for i in range(past_key.shape[0]):
        cache.update(past_key[i][:, :, :s], past_value[i][:, :, :s], i)
    embeds = predictor.small_to_mtp_projection(_embed(talker, s, code, talker_hidden))
    out = predictor.model(inputs_embeds=embeds, past_key_values=cache, use_cache=True, cache_position=torch.tensor([s]))
    layers = range(past_key.shape[0])
    return (
        predictor.lm_head[max(s - 1, 0)](out.last_hidden_state),
        torch.stack([cache[i][0][:, :, s : s + 1] for i in layers]),
        torch.stack([cache[i][1][:, :, s : s + 1] for i in layers]),
    )
