"""transformers: its generation utilities imported without scikit-learn.

This module is light: transformers is imported inside.
"""

from __future__ import annotations

from .registry import REQUIRED, SPEED_UP, register


@register("transformers.generation_without_sklearn", kind=SPEED_UP, checked={"transformers": "4.57.3"},
          symbols=("transformers.utils.import_utils._sklearn_available",),
          saves="scikit-learn and scipy.stats are not imported with transformers' generation utilities: "
                "0.7-0.9 s of every command that loads a transformers model (1.5 s of imports measured with "
                "-X importtime on 2 cores)",
          no_op="where transformers' generation utilities were imported before, or scikit-learn is not installed",
          upstream="transformers could import `sklearn.metrics.roc_curve` where assisted decoding's confidence "
                   "threshold uses it, not when `transformers.generation` is imported")
def generation_without_sklearn():
    """While a model's modules are imported, transformers counts scikit-learn as absent: its
    candidate generator imports `roc_curve` at import time only for assisted decoding's confidence
    threshold, which edgex never runs. transformers' own flag as it was after."""
    from transformers.utils import import_utils

    found = import_utils._sklearn_available
    import_utils._sklearn_available = False
    try:
        yield
    finally:
        import_utils._sklearn_available = found


@register("transformers.eager_attention", kind=REQUIRED, checked={"transformers": "4.57.3"},
          symbols=("transformers.PretrainedConfig._attn_implementation",),
          saves="the eager models run attention as their code writes it (transformers' `eager` implementation), "
                "not a kernel transformers picks for the host (SDPA): every process and host scores the same arithmetic",
          no_op="a config whose attention implementation is already `eager`",
          upstream="a public setter for a built config's attention implementation (the `attn_implementation` "
                   "argument of a config's constructor reaches the top config only, not the sub-configs it builds)")
def eager_attention(*configs) -> None:
    """Each config's attention implementation set to `eager` (a config with sub-configs passes it on)."""
    for config in configs:
        config._attn_implementation = "eager"
