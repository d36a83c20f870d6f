"""Bias surgery before QDQ quantization: one bias initializer per node that reads it, so ONNX
Runtime's quantizer never names a copy after an existing tensor."""

from __future__ import annotations

from pathlib import Path

from .onnx import drop_unread_initializers


# Ops whose input 2 ONNX Runtime's QDQ quantizer quantizes as a bias (scale from inputs 0 and 1).
_BIAS_OPS = ("Conv", "ConvTranspose", "Gemm", "InstanceNormalization", "LayerNormalization", "BatchNormalization")


def own_biases(source: Path, dest: Path) -> Path:
    """`source`, or a copy beside it in which every bias initializer read by more than one node
    is one initializer per node (same values, names `<bias>.edgex_bias<i>`).

    ONNX Runtime's quantizer gives each reader of a shared bias its own copy itself, named
    `<bias><n>` for the next free number among initializers only (`_dup_initializer`): with
    torch.onnx's `val_<n>` names that can be an existing activation's name. A diffusion
    policy's unrolled DDIM loop reads GroupNorm's constant bias `val_16` from 64 InstanceNormalization
    nodes, the copy `val_1636` took the name of a Reshape output, and quantization stopped with
    "Quantization parameter shared mode is not supported for weight yet"; where no error follows,
    the node reads that activation as its bias (tests/test_qnn.py)."""
    import onnx

    model = onnx.load(str(source), load_external_data=False)
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    readers: dict[str, list] = {}
    for node in graph.node:
        if node.op_type in _BIAS_OPS and len(node.input) > 2 and node.input[2] in inits:
            readers.setdefault(node.input[2], []).append(node)
    shared = {name: nodes for name, nodes in readers.items() if len(nodes) > 1}
    if not shared:
        return source
    for name, nodes in shared.items():
        for i, node in enumerate(nodes):
            copy = onnx.TensorProto()
            copy.CopyFrom(inits[name])
            copy.name = f"{name}.edgex_bias{i}"
            graph.initializer.append(copy)
            node.input[2] = copy.name
    drop_unread_initializers(graph, set(shared))
    # beside the source, so external-data locations (relative to the model's folder) stay valid
    owned = source.with_name(f"{dest.name}.own-bias.onnx")
    onnx.save(model, str(owned))
    return owned
