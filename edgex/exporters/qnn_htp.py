"""What the HTP needs of a graph whatever the scheme: constant padding written as concatenation
(`pads_as_concats`), a short row's convolution padding written as a matrix product
(`row_conv_pads_as_matmuls`), and the nodes that stay in float (fp16 on the HTP) in every quantized graph,
and why."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..component import Component


def for_the_htp(source: Path) -> None:
    """The graph at `source` rewritten in place as the HTP needs it whatever the scheme
    (`pads_as_concats`, then `row_conv_pads_as_matmuls`)."""
    pads_as_concats(source)
    row_conv_pads_as_matmuls(source)


def pads_as_concats(source: Path) -> int:
    """Rewrite each constant-mode Pad of the graph at `source` (in place) as a Concat of the input
    with constant blocks of the pad value along each padded axis; returns how many were rewritten.

    The HTP does not always write a constant Pad's padding: where its memory planner gives the Pad's
    output a buffer other tensors of the graph use later, the padded region keeps what the previous
    execution left there (measured in QAIRT's HTP simulator, fp16: a 450m robot policy's prefix graph, whose
    state vector is zero-padded from 6 to 32 before its projection, put out exact values on its
    first call and -3 to -17 dB on every later one; a 4-node graph with the same Pad before 960-wide
    matmuls does the same). A Concat with a constant block writes every element on every call.

    Left as they are: reflect / edge Pads (every output element is read from the input), negative
    (cropping) pads, and Pads whose pads, value or input shape are not static."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source), load_external_data=False)
    graph = model.graph
    constants = {t.name: t for t in graph.initializer}
    constants.update({n.output[0]: a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute if a.name == "value"})
    kinds = _tensor_types(model)

    def static(name: str):
        if name not in constants or constants[name].data_location == onnx.TensorProto.EXTERNAL:
            return None
        return numpy_helper.to_array(constants[name])

    nodes, rewritten = [], 0
    for node in graph.node:
        mode = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "mode"), b"constant")
        kind = kinds.get(node.input[0]) if node.op_type == "Pad" else None
        pads = static(node.input[1]) if kind is not None and len(node.input) > 1 else None
        value = static(node.input[2]) if pads is not None and len(node.input) > 2 and node.input[2] else np.zeros(())
        dims = [d.dim_value if d.HasField("dim_value") else None for d in kind.shape.dim] if kind is not None else []
        if (mode != b"constant" or pads is None or value is None or (len(node.input) > 3 and node.input[3])
                or (pads < 0).any() or None in dims or len(pads) != 2 * len(dims)):
            nodes.append(node)
            continue
        dtype = onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type)
        current, rank = node.input[0], len(dims)
        padded = [i for i in range(rank) if pads[i] or pads[i + rank]]
        for step, axis in enumerate(padded):
            parts = []
            for side, count in (("before", int(pads[axis])), ("after", int(pads[axis + rank]))):
                if count:
                    block = np.full([count if i == axis else d for i, d in enumerate(dims)], value.item(), dtype)
                    name = f"{node.name}_{side}_{axis}"
                    graph.initializer.append(numpy_helper.from_array(block, name))
                    parts.append(name)
            parts.insert(1 if pads[axis] else 0, current)
            out = node.output[0] if step == len(padded) - 1 else f"{node.name}_axis_{axis}"
            nodes.append(helper.make_node("Concat", parts, [out], name=f"{node.name}_as_concat_{axis}", axis=axis))
            current, dims[axis] = out, dims[axis] + int(pads[axis]) + int(pads[axis + rank])
        if not padded:
            nodes.append(helper.make_node("Identity", [node.input[0]], list(node.output), name=node.name))
        rewritten += 1
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
        used = {name for n in nodes for name in n.input}
        unused = [t for t in graph.initializer if t.name not in used]  # the Pads' own pads / value
        for tensor in unused:
            graph.initializer.remove(tensor)
        onnx.save(model, str(source))
    return rewritten


def _tensor_types(model) -> dict:
    """Each tensor's type (element type and shape, as ONNX's shape inference gives it), by name."""
    import onnx

    typed = onnx.shape_inference.infer_shapes(model).graph
    return {v.name: v.type.tensor_type for v in (*typed.value_info, *typed.input, *typed.output)}


def row_conv_pads_as_matmuls(source: Path) -> int:
    """Give each Conv over one row (a 1-D Conv, or a 2-D one of height 1) that pads 2 or more on a
    side of a row at most 8 x that padding wide its padded input as a MatMul with a constant 0 / 1
    matrix (the identity set among zero columns), its own pads 0; in place, returns how many.

    The HTP's fp16 convolution over a row computes wrong values when it pads 2 or more and the
    row's width is a multiple of 8 below 8 x the padding (measured in QAIRT's HTP simulator over
    every kernel size, dilation and channel count tried: padding 2 fails at width 8 only, 3 at 8
    and 16, 9 at 8 to 64, each at 2 to 3 dB against ONNX Runtime CPU and 69 dB at the other widths;
    padding of 1 and 2-D images never failed). A 263M-parameter robot policy's 1-D U-Net, whose
    5-wide convolutions run at width 8 after its first downsampling, scored 8 dB against its 30 dB
    gate so.
    The padding written as a Concat with zero blocks (`pads_as_concats`) does not help: where the
    Concat's input is another Conv's output the HTP folds the blocks back into the padding (the same
    2 dB). A MatMul is not folded, and it stays small for such short rows."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(source), load_external_data=False)
    graph = model.graph
    kinds = _tensor_types(model)
    nodes, rewritten = [], 0
    for node in graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        kind = kinds.get(node.input[0]) if node.op_type == "Conv" else None
        dims = [d.dim_value if d.HasField("dim_value") else None for d in kind.shape.dim] if kind is not None else []
        pads = list(attrs.get("pads", []))
        spatial = len(dims) - 2
        one_row = spatial == 1 or (spatial == 2 and dims[2] == 1 and pads[:1] + pads[2:3] == [0, 0])
        if (kind is None or None in dims or not one_row or attrs.get("auto_pad", b"NOTSET") != b"NOTSET"
                or len(pads) != 2 * spatial):
            nodes.append(node)
            continue
        before, after, width = pads[spatial - 1], pads[-1], dims[-1]
        if max(before, after) < 2 or width > 8 * max(before, after):
            nodes.append(node)
            continue
        embed = np.zeros((width, before + width + after), onnx.helper.tensor_dtype_to_np_dtype(kind.elem_type))
        embed[np.arange(width), np.arange(width) + before] = 1
        graph.initializer.append(numpy_helper.from_array(embed, f"{node.name}_padding"))
        padded = f"{node.name}_padded_input"
        nodes.append(helper.make_node("MatMul", [node.input[0], f"{node.name}_padding"], [padded], name=f"{node.name}_pad_as_matmul"))
        for attribute in node.attribute:
            if attribute.name == "pads":
                attribute.ints[:] = [0] * len(pads)
        node.input[0] = padded
        nodes.append(node)
        rewritten += 1
    if rewritten:
        del graph.node[:]
        graph.node.extend(nodes)
        onnx.save(model, str(source))
    return rewritten


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
