"""torch's operators: `torch.multinomial` drawn by a caller's sampler while a reference samples.

This module is light: torch is imported inside.
"""

from __future__ import annotations

from typing import Callable

from .registry import REQUIRED, register


@register("torch_ops.multinomial_drawn_by", kind=REQUIRED, checked={"torch": "2.13.0"},
          symbols=("torch.multinomial",),
          saves="the official Qwen3-TTS `generate()` (transformers' sampler) and edgex's runner draw the same "
                "noise, so a sampled utterance is compared code for code",
          no_op="outside a sampled comparison; greedy decoding never calls it",
          upstream="transformers' `generate()` takes a `torch.Generator`, not a sampler of the caller's")
def multinomial_drawn_by(draw: Callable):
    """`torch.multinomial` is `draw` (same arguments) for the duration; torch's own after."""
    import torch

    original = torch.multinomial
    torch.multinomial = draw
    try:
        yield
    finally:
        torch.multinomial = original
