"""A static QDQ graph read as data: its quantized constants and its activations' scales, for QNN's
scheme reference and stored-tensor checks. Nothing here runs the QDQ graph.

The integers, scales and zero points of every DequantizeLinear of a constant are decoded as
DequantizeLinear defines them ((q - zero point) x scale, per tensor or along `axis`). Each is paired
with the float constant it was made from (the fp32 graph's initializer of the same name, which
ONNX Runtime's quantizer suffixes `_quantized`) and checked against the independent quantizer
(`edgex.parity.quantizer.QDQ_SCHEMES` / `QDQ_CHANNEL_SCHEMES`, by the integer type and whether the
constant has one scale or one per channel); an int32 bias against round(b / s) x s
at the scale the graph records for it. The eager model then runs with those weights swapped in and
every linear layer's input fake-quantized at the scale and zero point the graph records there (`qdq_stored_scheme`); which linear emitted a MatMul / Gemm is read from the fp32
graph's name scopes (`pkg.torch.onnx.name_scopes`), as the quantizer keeps node names.

`graph_digest` identifies a QDQ graph: the context binary records the digest of the graph it was
compiled from, and the graph made again for the checks must have it.
"""

from __future__ import annotations

import ast
import hashlib
import re
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import onnx

    from ..component import Component

_OWN_BIAS = re.compile(r"\.edgex_bias\d+$")  # `qnn_bias.own_biases` copies
_LINEAR_OPS = ("MatMul", "Gemm")


def graph_digest(model: "onnx.ModelProto") -> str:
    """sha256 of a graph's nodes and initializers (not its name or doc strings): equal digests mean
    the same computation with the same stored values."""
    digest = hashlib.sha256()
    for node in model.graph.node:
        digest.update(node.SerializeToString(deterministic=True))
    for init in model.graph.initializer:
        digest.update(init.SerializeToString(deterministic=True))
    return digest.hexdigest()


def float_name(quantized: str) -> str:
    return _OWN_BIAS.sub("", quantized.removesuffix("_quantized"))


def _arrays(model: "onnx.ModelProto") -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def dequantized_constants(model: "onnx.ModelProto") -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]]:
    """{quantized initializer: (dequantized float32, integers, scale, zero point, axis)} for every
    DequantizeLinear that reads a constant."""
    inits = _arrays(model)
    found = {}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or node.input[0] not in inits:
            continue
        q = inits[node.input[0]]
        scale = inits[node.input[1]].astype(np.float32)
        zero = inits[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros_like(scale, dtype=np.int32)
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        s, z = scale, zero.astype(np.float32)
        if scale.ndim == 1 and scale.size > 1:
            shape = [1] * q.ndim
            shape[axis] = -1
            s, z = scale.reshape(shape), z.reshape(shape)
        found[node.input[0]] = (((q.astype(np.float32) - z) * s).astype(np.float32), q, scale, zero, axis % max(q.ndim, 1))
    return found


def qdq_tensors(model: "onnx.ModelProto", float_model: "onnx.ModelProto") -> dict:
    """Every quantized constant of the QDQ graph as a `QuantizedTensor` beside the fp32 graph's
    constant it was made from."""
    from ..parity.quantized import QuantizedTensor, blockwise
    from ..parity.quantizer import QDQ_CHANNEL_SCHEMES, QDQ_SCHEMES, QNN_MIN_RANGE, RANGE_WITH_ZERO, WeightScheme, with_block

    originals = _arrays(float_model)
    found = {}
    for name, (stored, q, scale, zero, axis) in dequantized_constants(model).items():
        original = originals.get(float_name(name))
        if original is None or original.dtype.kind != "f":
            found[name] = QuantizedTensor(stored.reshape(-1), np.zeros((0,), np.float32), None)
            continue
        original = original.astype(np.float32)
        scale_shape = [1] * q.ndim
        if scale.size > 1:
            scale_shape[axis] = scale.size
        dtype = q.dtype.name if q.dtype.name in QDQ_SCHEMES or q.dtype.kind != "i" or q.dtype.itemsize < 4 else "int32"
        if dtype == "int32":  # a bias: integers at the scale the graph derives for it (input x weight scale)
            codes = np.round(original / scale.reshape(scale_shape)) if scale.size > 1 else np.round(original / scale)
            want = (codes * (scale.reshape(scale_shape) if scale.size > 1 else scale)).astype(np.float32)
            found[name] = QuantizedTensor(stored.reshape(1, -1), original.reshape(1, -1), None, fixed=want.reshape(1, -1),
                                          scheme_name="QDQ int32 bias at its recorded scale")
            continue
        scheme = (QDQ_CHANNEL_SCHEMES if scale.size > 1 else QDQ_SCHEMES).get(dtype)
        if scheme is None:
            info = np.iinfo(q.dtype)
            scheme = WeightScheme(f"QDQ {dtype} per {'channel' if scale.size > 1 else 'tensor'}", info.bits, int(info.min),
                                  int(info.max), RANGE_WITH_ZERO, min_range=QNN_MIN_RANGE)
        rows, block = blockwise(stored, tuple(scale_shape) if q.ndim else ())
        base, _ = blockwise(original, tuple(scale_shape) if original.ndim else ())
        found[name] = QuantizedTensor(rows, base, with_block(scheme, block))
    return found


def _scopes(node) -> list[str]:
    return next((ast.literal_eval(p.value) for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), [])


def _activation(inits: dict, dq_or_q) -> "ActivationQuant":
    from ..parity.scheme import STATIC, ActivationQuant

    scale = float(inits[dq_or_q.input[1]].reshape(-1)[0])
    zero = inits[dq_or_q.input[2]] if len(dq_or_q.input) > 2 and dq_or_q.input[2] else np.zeros((), np.uint8)
    info = np.iinfo(zero.dtype)
    return ActivationQuant(STATIC, bits=info.bits, signed=info.min < 0, scale=scale, zero_point=int(zero.reshape(-1)[0]))


def qdq_stored_scheme(component: "Component", model: "onnx.ModelProto", float_model: "onnx.ModelProto",
                      linears: set[str]) -> "StoredScheme":
    """The scheme a QDQ graph records, as eager PyTorch applies it: every dequantized float constant
    as a stored weight (matched to the eager parameters by content, `parity.scheme.build`), and the
    static quantization of each linear layer's input (one per call of the layer)."""
    import torch

    from ..parity.scheme import StoredScheme, StoredWeight

    inits = _arrays(model)
    originals = _arrays(float_model)
    weights = {}
    for name, (stored, *_rest) in dequantized_constants(model).items():
        original = originals.get(float_name(name))
        if original is not None and original.dtype.kind == "f" and original.shape == stored.shape and original.size > 1:
            weights[name] = StoredWeight(torch.from_numpy(original.astype(np.float32)), torch.from_numpy(stored))
    producer = {out: n for n in model.graph.node for out in n.output}
    by_name = {n.name: n for n in model.graph.node}
    calls: dict[str, list] = {}  # linear -> its nodes in the fp32 graph, in graph order
    for node in float_model.graph.node:
        layer = next((s for s in reversed(_scopes(node)) if s in linears), None)
        if layer is not None:
            calls.setdefault(layer, []).append(node.name)
    inputs, missing = {}, []
    for layer, names in calls.items():
        ins = []
        nodes = [by_name[n] for n in names if n in by_name]
        for node in nodes:
            if node.op_type not in _LINEAR_OPS:
                continue
            dq = producer.get(node.input[0])
            if dq is not None and dq.op_type == "DequantizeLinear":
                ins.append(_activation(inits, dq))
        if ins:
            inputs[layer] = ins if len(ins) > 1 else ins[0]
        else:
            missing.append(layer)
    notes = ["activations fake-quantized at the scale and zero point the QDQ graph records on each linear layer's input; the "
             "graph's other activations (linear outputs, norms, attention) are float here: the HTP keeps values past their "
             "calibrated range where a QuantizeLinear saturates (a tiny talker decode graph at w8a16: quantizing the linear outputs "
             "too brought this reference to 16.6 dB of fp32 eager, the binary itself scores 23.3)"]
    if missing:
        notes.append(f"linear layers with no quantized input in the graph: {', '.join(sorted(missing))}")
    return StoredScheme("eager model with the QDQ graph's weights and activation scales (the graph is not run)",
                        weights, inputs, notes)
