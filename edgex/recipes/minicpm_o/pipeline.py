"""Eager utterances that the components' samples come from.

`HeadUtterance`: random text ids and LLM hidden states (no LLM is part of this recipe) conditioned
the official way, prefilled right-padded to the graph's chunk, then audio tokens drawn from the
reference logits at temperature 0.8 with a seeded generator, recording every decode step's input
embedding and position, up to the last slot. A step's KV cache (laid out in the graph's slots) is the
utterance's one cache with the slots from its position on zeroed: a decode call writes only its own
slot, so no step's cache is stored (one per step is 63 MB at the released size, ~500 steps).
"""

from __future__ import annotations

from collections.abc import Collection

import torch
from torch.nn import functional as F

from .presets import LLM_DIM
from .tts import MiniCPMTTSHead, decode_reference, prefill_reference

TEMPERATURE = 0.8  # the official TTSSamplingParams temperature
# Right padding of the prefill chunk in the samples (the real rows must stay exact). Pad rows repeat
# the last real row: an all-zero row has RMS 0, and fp16 RMSNorm of it is 0 * inf = NaN.
PAD_ROWS = 2


class HeadUtterance:
    """`step(k)`: the k-th decode call (inputs_embeds, position, past_key, past_value), the cache
    zero-padded to `slots` as a runner holds it; steps are drawn as they are asked for, up to the
    last slot (`last_step`). `key` / `value`: the cache of every step drawn so far."""

    @torch.no_grad()
    def __init__(self, head: MiniCPMTTSHead, prefill_len: int, slots: int, seed: int):
        self._head = head
        self._gen = torch.Generator().manual_seed(seed)
        text = prefill_len - 2 - PAD_ROWS
        text_ids = torch.randint(0, head.config["num_text_tokens"], (text,), generator=self._gen)
        llm_hidden = torch.randn(text, head.config["llm_dim"], generator=self._gen) * (LLM_DIM ** -0.5) * 8
        cond = head.condition(text_ids, llm_hidden)
        self.length = cond.shape[1]
        self.prefill_embeds = torch.cat((cond, cond[:, -1:].expand(1, PAD_ROWS, cond.shape[2])), dim=1)
        logits, key, value = prefill_reference(head, self.prefill_embeds)
        self.key = torch.zeros(key.shape[:3] + (slots, key.shape[4]))
        self.value = torch.zeros_like(self.key)
        self.key[:, :, :, : self.length] = key[:, :, :, : self.length]
        self.value[:, :, :, : self.length] = value[:, :, :, : self.length]
        self._logits = logits[:, self.length - 1]
        self.last_step = slots - 1 - self.length  # the call at the last slot
        self.steps: list[tuple] = []

    def step(self, k: int) -> tuple:
        if not 0 <= k <= self.last_step:
            raise IndexError(f"decode step {k} outside the head's {self.last_step + 1} cache slots after the prompt")
        while len(self.steps) <= k:
            self._draw()
        embeds, position = self.steps[k]
        return embeds, position, self._cache_before(self.key, position), self._cache_before(self.value, position)

    @staticmethod
    def _cache_before(cache: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """The cache as the call at `position` reads it: the slots before it, zeros from it on."""
        held = torch.zeros_like(cache)
        held[:, :, :, : int(position[0])] = cache[:, :, :, : int(position[0])]
        return held

    @torch.no_grad()
    def _draw(self) -> None:
        probs = torch.softmax(self._logits.reshape(-1) / TEMPERATURE, dim=-1)
        token = torch.multinomial(probs, 1, generator=self._gen).reshape(1, 1)
        position = torch.tensor([self.length + len(self.steps)])
        embeds = self._head.code_embeds(token)
        self.steps.append((embeds, position))
        logits, k, v = decode_reference(self._head, embeds, position, self.key, self.value)
        self.key[:, :, :, position] = k
        self.value[:, :, :, position] = v
        self._logits = logits[:, -1]


class VocoderUtterance:
    """A `frames`-long (50 Hz) non-streaming flow call as the official `inference` sets it up: a
    prompt (its tokens plus its mel as the condition) then new tokens, both random; the speaker
    embedding normalized and projected; the token embedding through the upsampling conformer and
    `encoder_proj` (mu). `noise` is the official buffer's slice [0, frames) for the example
    utterance (what the official call uses) and a fresh seeded draw otherwise; `states` holds the
    Euler state before each step of the loop (official `solve_euler` over each step's grid)."""

    @torch.no_grad()
    def __init__(self, flow, frames: int, steps: int, seed: int, official_noise: bool):
        from .flow import cosine_schedule, step_reference

        gen = torch.Generator().manual_seed(seed)
        up = int(flow.up_rate)
        tokens = frames // up
        prompt = max(1, tokens // 5)
        ids = torch.randint(0, flow.vocab_size, (1, tokens), generator=gen)
        self.prompt_mel = torch.randn(1, prompt * up, flow.output_size, generator=gen) * 2.0 - 5.0
        self.speaker = torch.randn(1, flow.spk_embed_affine_layer.in_features, generator=gen)
        self.tokens, self.prompt_tokens = ids[:, prompt:], ids[:, :prompt]
        self.spks = flow.spk_embed_affine_layer(F.normalize(self.speaker, dim=1))
        h, _ = flow.encoder(flow.input_embedding(ids), torch.tensor([tokens]))
        self.mu = flow.encoder_proj(h).transpose(1, 2).contiguous()
        self.cond = torch.zeros_like(self.mu)
        self.cond[:, :, : prompt * up] = self.prompt_mel.transpose(1, 2)
        cfm = flow.decoder
        shape = (1, flow.output_size, frames)
        self.noise = cfm.rand_noise[:, :, :frames].clone() if official_noise else torch.randn(shape, generator=gen)
        self.states, x = [], self.noise
        for t, dt in cosine_schedule(steps):
            t, dt = torch.tensor([t]), torch.tensor([dt])
            self.states.append((x, self.mu, self.spks, self.cond, t, dt))
            x = step_reference(cfm, x, self.mu, self.spks, self.cond, t, dt)[0]
        self.mel = x


SILENCE_TOKEN = 4218  # what Token2wav's `set_stream_cache` appends to the prompt as its lookahead


class EncoderStream:
    """A streaming utterance through the official flow model, as Token2wav's `set_stream_cache` /
    `stream` drive it: the prompt (`prompt` random tokens + 3 silence tokens, its mel, a speaker)
    through `setup_cache`, then `chunks - 1` calls of 25 + 3 lookahead tokens through
    `inference_chunk` and a last call (`last_chunk=True`) of `last` tokens (1..28: the official
    driver's flush of what is left), the attention caches trimmed to the prompt + 100 frames after
    each call exactly as `stream` trims them. Records, per
    call the official mel and the graphs' inputs: `inputs` / `flow_inputs` for `flow_encoder` /
    `flow_chunk` (every regular call, and a last call of exactly 25 tokens, which those graphs
    take with their `last_chunk` flag), `last_inputs` / `last_flow_inputs` for `flow_encoder_last`
    / `flow_chunk_last` (the last call). Encoder caches are right-aligned in `slots` 25 Hz slots,
    DiT caches left-aligned in 2 `slots` frames; mu is the official mu of the call.

    `keep` (call indices, negative from the end; None: every call) names the calls whose graph
    inputs are kept; the others keep only their mel. Every call still runs (each one's caches feed
    the next), but at the released sizes a call's inputs hold the DiT caches of every Euler step
    (about half a GB), so a sample utterance keeps the calls some sample reads, not all of them.
    `setup` (a runner's start when it replays the stream) is kept on request (`keep_setup`): it holds
    the CFM caches of all 16 official steps over the prompt."""

    @torch.no_grad()
    def __init__(self, flow, prompt: int, chunks: int, slots: int, steps: int, seed: int, last: int | None = None,
                 keep: Collection[int] | None = None, keep_setup: bool = False):
        from .encoder import CHUNK, LOOKAHEAD

        last = CHUNK if last is None else last
        self.kept = set(range(chunks)) if keep is None else {k % chunks for k in keep}
        gen = torch.Generator().manual_seed(seed)
        up = int(flow.up_rate)
        self.prompt_frames = prompt * up
        prompt_ids = torch.randint(0, flow.vocab_size, (1, prompt), generator=gen)
        self.tokens = torch.randint(0, flow.vocab_size, (1, (chunks - 1) * CHUNK + max(last, CHUNK + LOOKAHEAD)), generator=gen)
        prompt_mel = torch.randn(1, self.prompt_frames, flow.output_size, generator=gen) * 2.0 - 5.0
        self.speaker = torch.randn(1, flow.spk_embed_affine_layer.in_features, generator=gen)
        self.spks = flow.spk_embed_affine_layer(F.normalize(self.speaker, dim=1))
        pad = torch.full((1, LOOKAHEAD), SILENCE_TOKEN)
        cache = flow.setup_cache(torch.cat((prompt_ids, pad), dim=1), prompt_mel, self.speaker, n_timesteps=steps)
        self.setup = {k: v.clone() for k, v in cache.items()} if keep_setup else None
        self.chunks = []  # per call: the graphs' inputs, the official mel
        layers1 = len(flow.encoder.encoders)
        mus = []  # the official mu of each call, as `inference_chunk` hands it to the CFM
        hook = flow.encoder_proj.register_forward_hook(lambda _m, _i, out: mus.append(out.transpose(1, 2).contiguous()))
        try:
            self._chunks(flow, cache, chunks, last, slots, steps, up, layers1)
        finally:
            hook.remove()
        for chunk, mu in zip(self.chunks, mus):
            if "flow_inputs" in chunk:
                chunk["flow_inputs"] = (chunk["flow_inputs"][0], mu, *chunk["flow_inputs"][1:])
            if "last_flow_inputs" in chunk:
                width = up * (CHUNK + LOOKAHEAD)
                padded = F.pad(mu, (0, width - mu.shape[2]))
                chunk["last_flow_inputs"] = (chunk["last_flow_inputs"][0], padded, *chunk["last_flow_inputs"][1:])

    def _chunks(self, flow, cache, chunks, last_tokens, slots, steps, up, layers1):
        from .encoder import CHUNK, LOOKAHEAD

        for c in range(chunks):
            last = c == chunks - 1
            ids = self.tokens[:, c * CHUNK:c * CHUNK + (last_tokens if last else CHUNK + LOOKAHEAD)]
            record = self._inputs(flow, cache, ids, last, slots, steps, up, layers1) if c in self.kept else {}
            mel, cache = flow.inference_chunk(ids, self.speaker, {k: v.clone() for k, v in cache.items()},
                                              last_chunk=last, n_timesteps=steps)
            record["mel"] = mel
            self.chunks.append(record)
            self._trim(cache)

    def _inputs(self, flow, cache, ids, last, slots, steps, up, layers1) -> dict:
        """The graphs' inputs of the call of `ids` on `cache` (the state before it)."""
        from .encoder import CHUNK, LOOKAHEAD, dit_caches, graph_caches

        capacity = CHUNK + LOOKAHEAD
        att1, att2, n = graph_caches(cache["conformer_att_cache"], layers1, slots, up)
        cnn = cache["conformer_cnn_cache"].clone()
        dit = dit_caches(cache["estimator_att_cache"], cache["estimator_cnn_cache"], steps, up * slots)
        offset = int(dit[2])
        record = {}
        if not last or ids.shape[1] == CHUNK:
            graph_ids = torch.cat((ids, torch.zeros(1, LOOKAHEAD, dtype=ids.dtype)), dim=1) if last else ids
            record["inputs"] = (graph_ids, att1, att2, cnn, n, torch.tensor([1.0 if last else 0.0]))
            record["flow_inputs"] = (flow.decoder.rand_noise[:, :, offset:offset + CHUNK * up].clone(), self.spks, *dit)
        if last:
            count = torch.tensor([ids.shape[1]])
            padded = torch.cat((ids, torch.zeros(1, capacity - ids.shape[1], dtype=ids.dtype)), dim=1)
            record["last_inputs"] = (padded, att1, att2, cnn, n, count)
            noise = flow.decoder.rand_noise[:, :, offset:offset + capacity * up].clone()
            record["last_flow_inputs"] = (noise, self.spks, *dit, count * up)
        return record

    def _trim(self, cache: dict) -> None:
        """The attention caches cut to the prompt + 100 frames, as `stream` cuts them after a call."""
        from .encoder import trim_time

        cache["estimator_att_cache"] = trim_time(cache["estimator_att_cache"], 4, self.prompt_frames)
        cache["conformer_att_cache"] = trim_time(cache["conformer_att_cache"], 3, self.prompt_frames)
