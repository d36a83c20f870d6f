"""onnxscript: its constant folding pass, its default rewrite rules and a value test of its rewriter (read, nothing replaced).

This module is light: onnxscript is imported inside.
"""

from __future__ import annotations

from .registry import READ, register

_CHECKED = {"onnxscript": "0.7.2"}


@register("onnxscript.constant_folding_pass", kind=READ, checked=_CHECKED,
          symbols=("onnxscript.optimizer._constant_folding.FoldConstantsPass",
                   "onnxscript.optimizer._constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT",
                   "onnxscript.optimizer._constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT"),
          saves="constant folding as one pass of the ONNX exporter's single optimization round (the public "
                "`optimize_ir` folds and rewrites until nothing changes, twice the cost)",
          no_op="never off: the .onnx graph is folded by it",
          upstream="`FoldConstantsPass` exported from `onnxscript.optimizer` with its default limits")
def constant_folding_pass():
    """onnxscript's constant folding pass with its default size limits and shape inference, as
    `optimize_ir` builds it."""
    from onnxscript.optimizer import _constant_folding

    return _constant_folding.FoldConstantsPass(
        shape_inference=True,
        input_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_INPUT_SIZE_LIMIT,
        output_size_limit=_constant_folding.DEFAULT_CONSTANT_FOLD_OUTPUT_SIZE_LIMIT,
    )


@register("onnxscript.default_rewrite_rules", kind=READ, checked=_CHECKED,
          symbols=("onnxscript.rewriter._DEFAULT_REWRITE_RULES",),
          saves="the rules `optimize_ir` rewrites with, each on its own, so that the exporter can leave one out",
          no_op="never off: the .onnx graph is rewritten with them",
          upstream="a public list of the default rules, or `optimize_ir` taking rules to skip")
def default_rewrite_rules() -> list:
    """onnxscript's default rewrite rules, each rule set spread into its rules."""
    from onnxscript import rewriter

    return [rule for entry in rewriter._DEFAULT_REWRITE_RULES for rule in getattr(entry, "rules", [entry])]


@register("onnxscript.is_singleton_value", kind=READ, checked=_CHECKED,
          symbols=("onnxscript.rewriter._ir_utils.is_singleton_value",),
          saves="the test of a rewrite rule's constant inputs (a slice's axes, starts and ends) that "
                "onnxscript's own rules use, for the rotary embedding fusion",
          no_op="never off: the fusion matches with it",
          upstream="the function exported from `onnxscript.rewriter` with `pattern`")
def is_singleton_value(value, expected) -> bool:
    """Whether the ONNX IR `value` is a constant of one element equal to `expected` (or for which
    `expected`, a callable, holds)."""
    from onnxscript.rewriter import _ir_utils

    return _ir_utils.is_singleton_value(value, expected)
