"""Graph rewrites that ExecuTorch's XNNPACK lowering needs: numbers that survive fp16, and few partitions.

Both run on the exported program before `to_edge_transform_and_lower` (`executorch._xnnpack_ready`).
This module is light: torch is imported inside the functions.
"""

from __future__ import annotations

import math


def norm_decompositions() -> dict:
    """`run_decompositions` table: LayerNorm (which torch.export keeps as `aten.layer_norm`) as the
    ops `_layer_norm_by_peak` writes.

    ExecuTorch's portable `native_layer_norm` kernel (XNNPACK does not take the op) runs in the
    tensor's own type: in fp16 its row sums lose the mean and variance of a wide row. A 1024-channel
    LayerNorm (a 0.6b speech decoder's ConvNeXt, inputs of RMS 1) came out at -4.8 dB in the `.pte`
    and at 65 dB in eager fp16, and that decoder's whole conv stack `.pte` fp16 at 9.8 dB. Written out as
    means, XNNPACK takes the norm into its delegate (the means become pooling,
    `last_axis_reductions_as_pooling`) and accumulates in float32."""
    import torch

    aten = torch.ops.aten
    return {aten.layer_norm.default: _layer_norm_by_peak}


def _layer_norm_by_peak(x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    """`aten.layer_norm` with each centred row divided by its own peak
    magnitude before squaring, as `nn.transformer.rms_norm` does: (x - m) / sqrt(v + eps) =
    y / sqrt(mean(y^2) + (sqrt(eps) / peak)^2) with y = (x - m) / peak, so every square is in [0, 1]
    and none overflows or underflows fp16 whatever the row's scale. Exact in float32 as well."""
    import torch

    from ..nn.transformer import PEAK_FLOOR

    dims = len(normalized_shape)
    lead = x.shape[: x.dim() - dims]
    rows = x.reshape(*lead, -1) if dims > 1 else x
    mean = rows.mean(-1, keepdim=True)
    centred = rows - mean
    peak = centred.abs().amax(-1, keepdim=True) + PEAK_FLOOR
    y = centred / peak
    eps_root = torch.full((1,), math.sqrt(eps), dtype=x.dtype)
    inv = torch.rsqrt((y * y).mean(-1, keepdim=True) + torch.square(eps_root / peak))
    out = y * inv if dims == 1 else (y * inv).reshape(x.shape)
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out


def last_axis_reductions_as_pooling(program) -> int:
    """Rewrite `mean(x, -1, keepdim)` and `amax(x, -1, keepdim)` of a tensor of rank 2 or more as 4D
    pooling over the channels.

    XNNPACK takes a mean only as 4D average pooling over dims [2, 3] with keepdim, and a maximum only
    as `max.dim` of a 4D tensor (max pooling); every LayerNorm / RMSNorm written out by hand
    (`x.mean(-1, keepdim=True)`, fp16 RMSNorm's row peak, Qwen3's rank-4 q / k norms too) otherwise
    stays outside the delegate and splits it. Each split is a partition, and executorch legalizes and
    recompiles the whole graph once per partition and runs XNNPACK's passes per partition: a tiny
    flow-matching chunk graph (2 steps) went from 63 to 27 partitions. `[..., C]` is reshaped to `[1, N, C, 1]`,
    reduced over C and reshaped back: the same values. Returns how many were rewritten."""
    import operator

    import torch

    aten = torch.ops.aten
    graph = program.graph_module.graph
    rewritten = 0
    for node in list(graph.find_nodes(op="call_function", target=aten.mean.dim)) + list(
            graph.find_nodes(op="call_function", target=aten.amax.default)):
        val = node.args[0].meta.get("val")
        keepdim = len(node.args) > 2 and bool(node.args[2])
        if val is None or val.dim() < 2 or not keepdim or node.kwargs.get("dtype") is not None:
            continue
        if [d % val.dim() for d in node.args[1]] != [val.dim() - 1]:
            continue
        *lead, channels = val.shape
        with graph.inserting_before(node):
            pooled_in = graph.call_function(aten.reshape.default, (node.args[0], [1, -1, channels, 1]))
            if node.target == aten.mean.dim:
                pooled = graph.call_function(aten.mean.dim, (pooled_in, [2, 3], True))
            else:
                pooled = graph.call_function(operator.getitem, (graph.call_function(aten.max.dim, (pooled_in, 2, True)), 0))
            back = graph.call_function(aten.reshape.default, (pooled, [*lead, 1]))
        node.replace_all_uses_with(back)
        graph.erase_node(node)
        rewritten += 1
    program.graph_module.recompile()
    return rewritten
