"""What the HTP needs of a graph whatever the scheme: the nodes that stay in float (fp16 on the HTP)
in every quantized graph, and why."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..component import Component


# Ops the HTP computes wrongly in 16-bit quantized arithmetic (`fp16_on_htp`).
_FLOAT_OPS = ("Sqrt", "Reciprocal")
# The constant `edgex.nn.transformer.rms_norm` takes an RMSNorm's mean of squares with (a MatMul).
_MEAN_COLUMN = "edgex_mean_column"


def fp16_on_htp(source: Path) -> list[str]:
    """Nodes left in float (fp16 on the HTP) whatever the scheme.

    - Sqrt -> Reciprocal: the HTP's 16-bit quantized form of an RMSNorm's is wrong for small
      variances (measured on a tiny LLM decode graph: the same QDQ graph scores 13-16 dB on ONNX
      Runtime CPU and 0-4 dB in the HTP simulator, 13-17 dB with these nodes in float).
    - An RMSNorm's statistic, x * x -> mean (`rms_norm`'s MatMul against its mean column) -> + eps:
      one value per token, whose static range min / max calibration takes from the few tokens it
      sees; a held-out token's larger mean square is clipped to it and every value the norm puts out
      scales by the square root of the clip (measured: a tiny speech model's head decode graph at w8a16 whose
      first norm's statistic was calibrated to [0, 0.257] met 0.39 on a held-out first step, which
      then scored 15.2 dB against its independent reference, 25.7-34.1 dB at the other positions)."""
    import onnx

    graph = onnx.load(str(source), load_external_data=False).graph
    found = [n.name for n in graph.node if n.op_type in _FLOAT_OPS]
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    for node in graph.node:
        if node.op_type != "MatMul" or not node.input[1].endswith(_MEAN_COLUMN):
            continue
        square = producers.get(node.input[0])
        if square is not None and square.op_type == "Mul" and square.input[0] == square.input[1]:
            found.append(square.name)
        found.append(node.name)
        found += [c.name for c in consumers.get(node.output[0], []) if c.op_type == "Add"]
    return list(dict.fromkeys(found))


# Ops that only move or reshape a tensor: followed from a noise input to the Add that uses it.
_MOVES = ("Slice", "Gather", "Split", "Squeeze", "Unsqueeze", "Reshape", "Transpose", "Identity", "Cast")


_CHOICES = ("ArgMax", "TopK")


def sampling_nodes(source: Path, component: Component) -> list[str]:
    """The nodes of a sampling graph that take its noise input to the scores and the choice (the
    moves of the noise, the Add `logits + noise`, the ArgMax after it): left in float (fp16 on the
    HTP) whatever the scheme. A static range calibrated by min / max on a few noise draws clips a later draw's larger
    values, and Gumbel noise is unbounded: every score above the range saturates to the same value
    and the argmax among them is arbitrary (measured on an unrolled 15-step sampling graph at
    w8a16: one step's Add calibrated to 8.95, a held-out draw's best score there 14.07, a code
    flipped at margin 4.55 against a 0.65 tie margin; docs/targets-and-formats.md). In fp16 the
    scores are resolved to 2^-7 at 16."""
    import onnx

    noise = {s.sampled_from[1] for s in component.outputs if s.sampled_from and s.sampled_from[1]}
    if not noise:
        return []
    graph = onnx.load(str(source), load_external_data=False).graph
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    found, frontier = [], [i.name for i in graph.input if i.name in noise]
    while frontier:
        for node in consumers.get(frontier.pop(), []):
            if node.name in found or node.op_type not in (*_MOVES, "Add"):
                continue
            found.append(node.name)
            if node.op_type in _MOVES:
                frontier += list(node.output)
            else:  # the choice read from the scores: a quantized input would be the same saturated range
                found += [c.name for out in node.output for c in consumers.get(out, []) if c.op_type in _CHOICES]
    return found
