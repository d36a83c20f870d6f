"""torch.nn: modules built without their random initialization where every parameter is written after.

This module is light: torch is imported inside.
"""

from __future__ import annotations

from .registry import SPEED_UP, register


@register("torch_nn.construct_without_random_init", kind=SPEED_UP, checked={"torch": "2.13.0"},
          symbols=("torch.nn.Linear.reset_parameters", "torch.nn.Embedding.reset_parameters",
                   "torch.nn.modules.conv._ConvNd.reset_parameters"),
          saves="the random init of modules whose parameters are all written afterwards (about 1e9 draws for the "
                "1.7b talker): the qwen3-tts 0.6b preset build 14.4 -> 6.9 s, the weights bit-identical",
          no_op="a module of another type (norms, subclasses) initializes as its package wrote it",
          upstream="transformers' `from_config` building on the meta device, or torch modules taking an "
                   "uninitialized-storage switch")
def construct_without_random_init(written_after: tuple[type, ...]):
    """Within this context, modules whose type is exactly one of `written_after` (some of `nn.Linear`,
    `nn.Embedding` and the convolutions) are built with uninitialized storage: their
    `reset_parameters` does nothing and marks them initialized (`_is_hf_initialized`), which
    transformers' `_init_weights` then skips too. The caller writes every parameter of those types
    after construction (a seeded init, or a checkpoint's state dict)."""
    from torch import nn

    originals = {cls: cls.reset_parameters for cls in (nn.Linear, nn.Embedding, nn.modules.conv._ConvNd)}

    def skipping(original):
        def reset_parameters(self):
            if type(self) in written_after:
                self._is_hf_initialized = True
                return
            original(self)

        return reset_parameters

    try:
        for cls, original in originals.items():
            cls.reset_parameters = skipping(original)
        yield
    finally:
        for cls, original in originals.items():
            cls.reset_parameters = original
