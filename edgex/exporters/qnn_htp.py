"""What the HTP needs of a graph whatever the scheme: the nodes that stay in float (fp16 on the HTP)
in every quantized graph, and why."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..component import Component


# Ops the HTP computes wrongly in 16-bit quantized arithmetic (`fp16_on_htp`).
_FLOAT_OPS = ("Sqrt", "Reciprocal")


def fp16_on_htp(source: Path) -> list[str]:
    """Nodes left in float (fp16 on the HTP) whatever the scheme: the HTP's 16-bit quantized
    Sqrt -> Reciprocal of an RMSNorm is wrong for small variances (measured on a tiny LLM decode graph:
    the same QDQ graph scores 13-16 dB on ONNX Runtime CPU and 0-4 dB in the HTP simulator, 13-17 dB
    with these nodes in float)."""
    import onnx

    graph = onnx.load(str(source), load_external_data=False).graph
    return [n.name for n in graph.node if n.op_type in _FLOAT_OPS]


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
