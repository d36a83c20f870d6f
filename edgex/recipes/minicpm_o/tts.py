"""MiniCPM-o's TTS head (`MiniCPMTTS`): edgex's own implementation with the checkpoint's names.

The official class exists only as hub remote code (`modeling_minicpmo.py`), so edgex carries the
parts speech output needs, built as that code builds them: a transformers `LlamaModel` backbone
(from a `LlamaConfig` with the head's sizes and transformers' defaults otherwise: RoPE theta 1e4,
RMSNorm eps 1e-6, a 32000-row `embed_tokens` that is never used), `emb_text`, one codebook
`emb_code.0`, `head_code.0` under torch's weight-norm parametrization, and the two projectors
(`projector_semantic` is used; `projector_spk` exists in the checkpoint but the released condition
type passes no speaker embedding). Conditioning ("hidden_text_merge"): `emb_text(text ids) +
normalize(projector_semantic(LLM hidden))`, then `emb_text(text_eos)` and `emb_text(audio_bos)`.

The graphs (`TTSPrefill`, `TTSDecode`) take embeddings and an explicit KV cache and compute the
backbone with `edgex.nn.transformer`; `head_code` enters them with its weight norm folded once
(`MiniCPMTTSHead.output_weight`), the same Parameter the eager `logits` multiply by. Sampling
(temperature, top-k/top-p, repetition penalty) stays in the runner, on the logits.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers import LlamaConfig, LlamaModel
from transformers.cache_utils import DynamicCache

from ...nn.transformer import (attach_norm_constants, causal_valid, decoder_stack, mask_from_valid,
                              register_rope, rope_cos_sin, rope_inv_freq, step_valid)


class SemanticProjector(nn.Module):
    """`linear1 -> ReLU -> linear2` from the LLM width to the head's (the official "mlp" projector)."""

    def __init__(self, in_dim: int, out_dim: int):
        super().__init__()
        self.linear1 = nn.Linear(in_dim, out_dim)
        self.linear2 = nn.Linear(out_dim, out_dim)

    def forward(self, x):
        return self.linear2(F.relu(self.linear1(x)))


class MiniCPMTTSHead(nn.Module):
    """The TTS head; parameter names are the checkpoint's without the `tts.` prefix."""

    def __init__(self, config: dict):
        super().__init__()
        self.config = dict(config)
        hidden = config["hidden_size"]
        self.backbone_config = LlamaConfig(
            hidden_size=hidden, intermediate_size=config["intermediate_size"],
            num_attention_heads=config["num_attention_heads"], num_hidden_layers=config["num_hidden_layers"],
            num_key_value_heads=config["num_key_value_heads"],
            max_position_embeddings=config["max_position_embeddings"], attn_implementation="sdpa",
        )
        self.emb_text = nn.Embedding(config["num_text_tokens"], hidden)
        self.model = LlamaModel(self.backbone_config)
        self.projector_spk = SemanticProjector(config["llm_dim"], hidden)
        self.projector_semantic = SemanticProjector(config["llm_dim"], hidden)
        self.emb_code = nn.ModuleList([nn.Embedding(config["num_audio_tokens"], hidden)])
        self.head_code = nn.ModuleList(
            [nn.utils.parametrizations.weight_norm(nn.Linear(hidden, config["num_audio_tokens"], bias=False))]
        )
        self._folded: dict = {}  # output_weight's cache: a plain dict, so state_dict() keeps the checkpoint's names

    @property
    def eos_token(self) -> int:
        return self.config["num_audio_tokens"] - 1

    def condition(self, text_ids: torch.Tensor, llm_hidden: torch.Tensor) -> torch.Tensor:
        """text ids [n], LLM hidden states [n, llm_dim] -> prefill embeddings [1, n + 2, hidden]."""
        hidden = self.projector_semantic(llm_hidden)
        if self.config["normalize_projected_hidden"]:
            hidden = F.normalize(hidden, p=2, dim=-1)
        special = torch.tensor([self.config["text_eos_token_id"], self.config["audio_bos_token_id"]])
        return torch.cat((self.emb_text(text_ids) + hidden, self.emb_text(special)))[None]

    def code_embeds(self, token: torch.Tensor) -> torch.Tensor:
        """audio token ids [1, n] -> embeddings [1, n, hidden] (one codebook)."""
        return self.emb_code[0](token)

    def output_weight(self) -> nn.Parameter:
        """`head_code.0`'s weight with its norm folded (torch's parametrization, evaluated once), as
        one Parameter that the export graphs hold and `logits` multiplies by.

        Why one shared Parameter: a scheme reference swaps what a quantized file stores into the
        graph's parameters. Were the eager head to recompute g v / ||v|| from `original0/1` on every
        call, the reference would keep an fp32 output layer, and a 4-bit head's rounding of it would
        show up as a 20-21 dB "lowering" error. The checkpoint's parametrized names stay
        in `state_dict()`; the fold is recomputed (into the same Parameter) when `original0/1` change,
        e.g. when a checkpoint is loaded after the first call."""
        parametrized = self.head_code[0].parametrizations.weight
        version = (parametrized.original0._version, parametrized.original1._version)
        if self._folded.get("version") != version:
            with torch.no_grad():
                folded = self.head_code[0].weight.detach().clone()
            if "weight" in self._folded:
                self._folded["weight"].data = folded
            else:
                self._folded["weight"] = nn.Parameter(folded, requires_grad=False)
            self._folded["version"] = version
        return self._folded["weight"]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.output_weight())


class _HeadGraph(nn.Module):
    def __init__(self, head: MiniCPMTTSHead, positions: int):
        """`positions`: the bound of the positions the graph takes (prefill: its chunk; decode: its KV slots)."""
        super().__init__()
        self.model = head.model
        for layer in self.model.layers:  # Llama has no q/k norms; edgex.nn's attention skips Identity
            layer.self_attn.q_norm = layer.self_attn.k_norm = nn.Identity()
        attach_norm_constants(self.model)
        register_rope(self, "rope", rope_inv_freq(head.backbone_config), positions)
        self.head_weight = head.output_weight()  # shared with the eager head: see output_weight

    def _run(self, embeds, positions, past_key, past_value, mask):
        cos, sin = rope_cos_sin(self, "rope", positions, embeds.dtype)
        hidden, keys, values = decoder_stack(self.model, embeds, cos, sin, past_key, past_value, mask)
        return torch.matmul(hidden, self.head_weight.t()), keys, values


class TTSPrefill(_HeadGraph):
    """inputs_embeds [1, P, H] (the conditioning, right-padded) -> logits [1, P, 6562], key/value [L, 1, KV, P, D].

    Causal attention keeps the real rows exact whatever the padding; pad with non-zero rows (e.g.
    the last real one repeated): an all-zero row is NaN through fp16 RMSNorm."""

    def forward(self, inputs_embeds):
        seq = inputs_embeds.shape[1]
        mask = mask_from_valid(causal_valid(seq, seq), inputs_embeds.dtype)[None, None]
        return self._run(inputs_embeds, torch.arange(seq), None, None, mask)


class TTSDecode(_HeadGraph):
    """One audio token: inputs_embeds [1, 1, H] (`emb_code.0` of the last token), position [1] (cached
    tokens), past key/value [L, 1, KV, S, D] -> logits [1, 1, 6562], this step's key/value."""

    def forward(self, inputs_embeds, position, past_key, past_value):
        mask = mask_from_valid(step_valid(past_key.shape[3], position), inputs_embeds.dtype)[None, None, None]
        return self._run(inputs_embeds, position, past_key, past_value, mask)


def _stack(cache: DynamicCache, layers: int, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.stack([cache.layers[i].keys[:, :, start:] for i in range(layers)]),
            torch.stack([cache.layers[i].values[:, :, start:] for i in range(layers)]))


@torch.no_grad()
def prefill_reference(head: MiniCPMTTSHead, inputs_embeds):
    """The head as the official `generate` runs its first step: LlamaModel over the conditioning."""
    out = head.model(inputs_embeds=inputs_embeds, use_cache=True)
    key, value = _stack(out.past_key_values, len(head.model.layers), 0)
    return head.logits(out.last_hidden_state), key, value


@torch.no_grad()
def decode_reference(head: MiniCPMTTSHead, inputs_embeds, position, past_key, past_value):
    """One official decode step: LlamaModel with a DynamicCache of the first `position` entries."""
    n = int(position.reshape(-1)[0])
    cache = DynamicCache()
    for i in range(past_key.shape[0]):
        cache.update(past_key[i][:, :, :n], past_value[i][:, :, :n], i)
    out = head.model(inputs_embeds=inputs_embeds, past_key_values=cache, use_cache=True,
                     position_ids=torch.tensor([[n]]), cache_position=torch.tensor([n]))
    key, value = _stack(out.past_key_values, len(head.model.layers), n)
    return head.logits(out.last_hidden_state), key, value
