"""Graph rewrites that only ONNX Runtime artifacts get: edgex's fp32 transformer pieces
(`edgex.nn.transformer`) into ONNX Runtime's one-kernel contrib ops.

The pieces are written for every backend (XNNPACK does not delegate a 3-D mean, QNN wants plain
ops), so in ONNX Runtime each is a run of small nodes, and per call a node costs a few
microseconds whatever its size: before these rewrites the 0.6b predictor frame ran ~5,500 nodes a
call and the talker step ~1,400, most of them RMSNorm and RoPE arithmetic on a few KB. The QNN and
MNN converters start from the unfused graph (`OnnxExporter.graph`)."""

from __future__ import annotations

import numpy as np

from ..patches.onnxscript import is_singleton_value


def fuse_for_onnxruntime(model) -> dict[str, int]:
    """Apply every rewrite below to an onnx_ir model in place; how many of each were fused. The
    nodes a rewrite leaves unused are removed once, at the end."""
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions.skip_normalization import fuse_skip_rms_normalization

    counts = {"fused_rms_norms": fuse_rms_norms(model), "fused_rotary_embeddings": fuse_rotary_embeddings(model)}
    # onnxscript's own rule: the residual Add feeding a SimplifiedLayerNormalization -> one kernel
    counts["fused_skip_rms_norms"] = fuse_skip_rms_normalization(model)
    ir.passes.common.CommonSubexpressionEliminationPass()(model)
    ir.passes.common.RemoveUnusedNodesPass()(model)
    return {name: n for name, n in counts.items() if n}


def fuse_rms_norms(model) -> int:
    """Rewrite every fp32 RMSNorm that `edgex.nn.transformer.rms_norm` emits (seven nodes: x * x, its
    mean as a MatMul against a constant 1/n column, + eps, Sqrt, Reciprocal, x * that, * weight) into
    ONNX Runtime's one-kernel `SimplifiedLayerNormalization` (fp32 statistics, the same formula).
    In ONNX Runtime the seven nodes were 40 % of the 0.6b predictor frame's ~5,500 nodes per call.
    Returns how many were fused."""
    import onnx_ir as ir
    from onnxscript.rewriter import pattern

    class RmsNormAsMatmul(pattern.RewriteRuleClassBase):
        def __init__(self, name: str, weight_first: bool):
            super().__init__(name)
            self._weight_first = weight_first

        def pattern(self, op, x, mean_column, epsilon, weight):
            normalized = op.Mul(x, op.Reciprocal(op.Sqrt(op.Add(op.MatMul(op.Mul(x, x), mean_column), epsilon))))
            return op.Mul(weight, normalized) if self._weight_first else op.Mul(normalized, weight)

        def check(self, op, x, mean_column, epsilon, weight, **_):
            result = pattern.MatchResult()
            column, eps = mean_column.const_value, epsilon.const_value
            if x.dtype != ir.DataType.FLOAT or column is None or eps is None or eps.size != 1:
                return result.fail("not an fp32 RMSNorm with constant statistics")
            n = column.shape[0] if len(column.shape) == 2 and column.shape[1] == 1 else 0
            if not n or not np.allclose(column.numpy(), 1.0 / n, rtol=1e-6, atol=0) or weight.shape != ir.Shape([n]):
                return result.fail("the MatMul is not a mean over the last axis with a per-channel weight")
            return result

        def rewrite(self, op, x, mean_column, epsilon, weight, **_):
            return op.SimplifiedLayerNormalization(x, weight, axis=-1, epsilon=float(epsilon.const_value.numpy().item()),
                                                   stash_type=1)

    rules = pattern.RewriteRuleSet([RmsNormAsMatmul.rule(f"EdgexRmsNorm{first}", weight_first=first) for first in (True, False)])
    return rules.apply_to_model(model)


def _through(value, *op_types: str):
    """The value behind a chain of `op_types` producers (Unsqueeze, Reshape ...), or None."""
    node = value.producer()
    while node is not None and node.op_type in op_types:
        value = node.inputs[0]
        node = value.producer()
    return value


def _half_table(table, trig: str, positions: int, half: int):
    """What ONNX Runtime's RotaryEmbedding reads for `table` ([1, 1, P, D], cos or sin of the NeoX
    angles, `trig` its op), when its two halves are equal, as RotaryEmbedding assumes; else None:
    - ("gathered", cache, ids): rows `ids` [P] of a constant [N, D] table behind Unsqueezes, what
      `edgex.nn.transformer.rope_cos_sin` gathers (the cache is its first half [N, D/2]);
    - ("constant", cache): a constant table (positions known at export), the cache its first half;
    - ("angles", m): trig(Concat(m, m) on the last axis) behind Unsqueezes, the angles computed in the
      graph (`rope_cos_sin` where the graph has no table; the cache is then trig(m))."""
    import onnx_ir as ir

    if table.shape != ir.Shape([1, 1, positions, 2 * half]):
        return None
    if table.const_value is not None:
        values = table.const_value.numpy().reshape(positions, 2 * half)
        return ("constant", values[:, :half]) if np.array_equal(values[:, :half], values[:, half:]) else None
    gather = _through(table, "Unsqueeze").producer()
    if gather is not None and gather.op_type == "Gather" and gather.domain == "" and gather.inputs[0].const_value is not None:
        axis = gather.attributes.get("axis")
        values, ids = gather.inputs[0].const_value.numpy(), gather.inputs[1]
        if (axis is not None and axis.value != 0) or values.ndim != 2 or values.shape[1] != 2 * half or ids.shape != ir.Shape([positions]):
            return None
        return ("gathered", values[:, :half], ids) if np.array_equal(values[:, :half], values[:, half:]) else None
    node = _through(table, "Unsqueeze").producer()
    cat = node.inputs[0].producer() if node is not None and node.op_type == trig and node.domain == "" else None
    if cat is None or cat.op_type != "Concat" or len(cat.inputs) != 2 or cat.inputs[0] is not cat.inputs[1]:
        return None
    axis = cat.attributes.get("axis")
    angles = cat.inputs[0]
    if angles.shape != ir.Shape([positions, half]) or axis is None or axis.value not in (-1, 1):
        return None
    return ("angles", angles)


def fuse_rotary_embeddings(model) -> int:
    """Rewrite every fp32 NeoX RoPE that `edgex.nn.transformer.apply_rope` emits (x * cos +
    cat(-x[.., D/2:], x[.., :D/2]) * sin: seven nodes per q or k) into ONNX Runtime's contrib
    `RotaryEmbedding` (non-interleaved). Its cos/sin caches are the graph's own half-angle table
    (cos and sin of the same values edgex's table concatenates twice): where the graph gathers rows
    of a stored [N, D] table, its first half [N, D/2] indexed by the graph's own position ids;
    otherwise the [P, D/2] table of this call indexed by 0 .. P-1. Either way the positions the graph
    computes are the ones rotated. Returns how many were fused."""
    import onnx_ir as ir
    from onnxscript.rewriter import pattern

    class NeoxRope(pattern.RewriteRuleClassBase):
        def pattern(self, op, x, cos, sin, start_hi, end_hi, start_lo, end_lo, axes_hi, axes_lo, steps_hi, steps_lo):
            high = op.Slice(x, start_hi, end_hi, axes_hi, steps_hi)
            rotated = op.Concat(op.Neg(high), op.Slice(x, start_lo, end_lo, axes_lo, steps_lo), axis=-1)
            return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))

        def check(self, op, x, cos, sin, start_hi, end_hi, start_lo, end_lo, axes_hi, axes_lo, steps_hi, steps_lo, **_):
            result = pattern.MatchResult()
            shape = x.shape
            if x.dtype != ir.DataType.FLOAT or shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape):
                return result.fail("not a static fp32 [B, heads, P, D] tensor")
            if shape[0] != 1:
                return result.fail("batch is not 1")
            dim, half = shape[3], shape[3] // 2
            last = lambda v: is_singleton_value(v, lambda a: a in (-1, 3))  # noqa: E731
            one = lambda v: is_singleton_value(v, 1)  # noqa: E731
            if not (last(axes_hi) and last(axes_lo) and one(steps_hi) and one(steps_lo) and is_singleton_value(start_hi, half)
                    and is_singleton_value(end_hi, lambda e: e >= dim) and is_singleton_value(start_lo, 0)
                    and is_singleton_value(end_lo, half)):
                return result.fail("not a rotate-half of the last axis")
            tables = _half_table(cos, "Cos", shape[2], half), _half_table(sin, "Sin", shape[2], half)
            if None in tables:
                return result.fail("cos / sin are not a NeoX table over this call's positions")
            if tables[0][0] != tables[1][0] or (tables[0][0] == "gathered" and tables[0][2] is not tables[1][2]):
                return result.fail("cos and sin are not read at the same positions")
            return result

        def rewrite(self, op, x, cos, sin, **_):
            positions, half = x.shape[2], x.shape[3] // 2

            def cache(table, trig):
                kind, value, *_ = _half_table(table, trig, positions, half)
                return getattr(op, trig)(value) if kind == "angles" else op.Constant(value=ir.tensor(np.ascontiguousarray(value)))

            gathered = _half_table(cos, "Cos", positions, half)
            if gathered[0] == "gathered":
                ids = op.Unsqueeze(op.Cast(gathered[2], to=ir.DataType.INT64), op.Constant(value=ir.tensor(np.array([0], np.int64))))
            else:
                ids = op.Constant(value=ir.tensor(np.arange(positions, dtype=np.int64)[None, :]))
            return op.RotaryEmbedding(x, ids, cache(cos, "Cos"), cache(sin, "Sin"), interleaved=0, num_heads=x.shape[1],
                                      _domain="com.microsoft")

    return pattern.RewriteRuleSet([NeoxRope.rule("EdgexNeoxRope")]).apply_to_model(model)
