"""coremltools: its weight compression pass applied alone, and the ML program a model holds (read, nothing replaced).

This module is light: coremltools is imported inside.
"""

from __future__ import annotations

from .registry import READ, register

_CHECKED = {"coremltools": "9.0"}


@register("coremltools.weight_compression_alone", kind=READ, checked=_CHECKED,
          symbols=("coremltools.optimize.coreml._quantization_passes.linear_quantize_weights",
                   "coremltools.models.utils._apply_graph_pass"),
          saves="w8 / w4 Core ML packages compressed by the one pass: the public "
                "`coremltools.optimize.coreml.linear_quantize_weights` re-runs the whole default pipeline on "
                "the result (minutes on a big graph, and the skipped pass's crash)",
          no_op="never off: the compressed package is built with it",
          upstream="`linear_quantize_weights` taking a pass pipeline, or returning the program without "
                   "re-running the default one")
def compressed_program(model, config, spec_version: int):
    """The pymil program of `model` (an `MLModel`) after coremltools' linear weight quantization pass
    alone, with `config` (an `OptimizationConfig`)."""
    from coremltools.models.utils import _apply_graph_pass
    from coremltools.optimize.coreml._quantization_passes import linear_quantize_weights

    return _apply_graph_pass(model, linear_quantize_weights(config=config), spec_version=spec_version,
                             return_pymil_prog=True)


@register("coremltools.model_program", kind=READ, checked=_CHECKED,
          symbols=("coremltools.models.model.MLModel._mil_program",),
          saves="the operations of a converted model's ML program (its constants, with their values, and its op "
                "types) without reading the saved package back",
          no_op="never off: the constants left uncompressed and the op list of the summary are read from it",
          upstream="a public accessor for the pymil program an `MLModel` was converted from")
def main_operations(model) -> list:
    """The operations of the main function of the ML program `model` (an `MLModel`) was converted from."""
    return list(model._mil_program.functions["main"].operations)
