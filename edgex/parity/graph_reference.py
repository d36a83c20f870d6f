"""An ONNX graph run on ONNX Runtime's CPU execution provider, as a scheme reference.

Where a format's scheme is itself a graph that a CPU runtime executes exactly, that graph is a
better scheme reference than the eager model with weights swapped in: a static QDQ graph quantizes
every activation tensor (QuantizeLinear -> DequantizeLinear pairs), not only the linears' inputs,
and ONNX Runtime's CPU kernels compute those in fp32 exactly as the operators define them. The
artifact compiled from the graph (a QNN context binary) then differs from it only by its lowering:
the HTP's integer kernels, requantization and the fp16 of its float nodes.

Sampled tokens (`TensorSpec.sampled_from`) are teacher-forced as in the eager reference: each
ArgMax of the graph, in graph order one per token position, is replaced by the forced token at that
position. The forced graph is checked at construction: forced with its own free-run tokens it must
reproduce its free-run outputs exactly, so a wrong surgery cannot go unnoticed.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..component import TOKENS

if TYPE_CHECKING:
    import onnx

    from ..component import Component

FORCED = "forced_{}"  # graph input carrying the forced tokens of one TOKENS output


def graph_digest(model: "onnx.ModelProto") -> str:
    """sha256 of a graph's nodes and initializers (not its name or doc strings): equal digests mean
    the same computation with the same stored values."""
    digest = hashlib.sha256()
    for node in model.graph.node:
        digest.update(node.SerializeToString(deterministic=True))
    for init in model.graph.initializer:
        digest.update(init.SerializeToString(deterministic=True))
    return digest.hexdigest()


def _session(model: "onnx.ModelProto"):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # run the QDQ pairs as written
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def forced_graph(model: "onnx.ModelProto", token_output: str, positions: int) -> "onnx.ModelProto":
    """A copy of `model` whose ArgMax nodes (in graph order, one per token position) take the
    forced token at their position from a new int64 input `forced_<token_output>` instead."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper, shape_inference

    inferred = shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.graph.value_info, *inferred.graph.output)}
    argmaxes = [n for n in model.graph.node if n.op_type == "ArgMax"]
    if len(argmaxes) != positions:
        raise ValueError(f"{token_output}: {positions} token positions but the graph has {len(argmaxes)} ArgMax nodes")
    forced = onnx.ModelProto()
    forced.CopyFrom(model)
    name = FORCED.format(token_output)
    forced.graph.input.append(helper.make_tensor_value_info(name, TensorProto.INT64, None))
    flat = f"{name}_flat"
    nodes = [helper.make_node("Reshape", [name, f"{name}_minus_one"], [flat])]
    inits = [numpy_helper.from_array(np.array([-1], np.int64), f"{name}_minus_one")]
    for k, node in enumerate(argmaxes):
        shape = shapes.get(node.output[0])
        if not shape or any(d <= 0 for d in shape) or int(np.prod(shape)) != 1:
            raise ValueError(f"ArgMax {node.name}: output shape {shape} is not one static token")
        inits += [numpy_helper.from_array(np.array([k], np.int64), f"{name}_{k}_start"),
                  numpy_helper.from_array(np.array([k + 1], np.int64), f"{name}_{k}_end"),
                  numpy_helper.from_array(np.array(shape, np.int64), f"{name}_{k}_shape")]
        nodes += [helper.make_node("Slice", [flat, f"{name}_{k}_start", f"{name}_{k}_end"], [f"{name}_{k}"]),
                  helper.make_node("Reshape", [f"{name}_{k}", f"{name}_{k}_shape"], [node.output[0]])]
    kept = [n for n in forced.graph.node if n.op_type != "ArgMax"]
    del forced.graph.node[:]
    forced.graph.node.extend(nodes + kept)  # the forced tokens first: every consumer comes after them
    forced.graph.initializer.extend(inits)
    return forced


class GraphReference:
    """`(inputs, forced tokens | None) -> outputs` of an ONNX graph on ONNX Runtime CPU; the
    graph's inputs and outputs are the component's, in order."""

    def __init__(self, component: Component, model: "onnx.ModelProto", label: str, details: dict | None = None):
        self.component, self.label = component, label
        self.details = {"graph_sha256": graph_digest(model), **(details or {})}
        self._model = model
        self._free = _session(model)
        self._forced = {}

    def __call__(self, inputs, forced_tokens: dict | None = None) -> tuple:
        feeds = {i.name: np.asarray(t.detach().cpu().numpy()) for i, t in zip(self._free.get_inputs(), inputs)}
        if not forced_tokens:
            return tuple(torch.from_numpy(np.asarray(o)) for o in self._free.run(None, feeds))
        session = self._forced_session(tuple(sorted(forced_tokens)))
        feeds |= {FORCED.format(n): forced_tokens[n].detach().cpu().numpy().astype(np.int64) for n in forced_tokens}
        return tuple(torch.from_numpy(np.asarray(o)) for o in session.run(None, feeds))

    def _forced_session(self, names: tuple[str, ...]):
        if names not in self._forced:
            model = self._model
            specs = {s.name: s for s in self.component.outputs if s.kind == TOKENS and s.sampled_from}
            for name in names:
                if name not in specs:
                    raise ValueError(f"{self.component.name}: output {name} is no sampled token output, it cannot be forced")
                model = forced_graph(model, name, int(np.prod(specs[name].shape)))
            session = _session(model)
            self._check(session, names)
            self._forced[names] = session
        return self._forced[names]

    def _check(self, session, names: tuple[str, ...]) -> None:
        """Forced with its own free-run tokens on a sample, the forced graph must give the free-run
        outputs bit for bit (else the ArgMax order or shapes were misread)."""
        inputs = next(iter(self.component.samples.values()))
        free = self(inputs)
        feeds = {i.name: np.asarray(t.detach().cpu().numpy()) for i, t in zip(self._free.get_inputs(), inputs)}
        by_name = dict(zip((s.name for s in self.component.outputs), free))
        feeds |= {FORCED.format(n): by_name[n].numpy().astype(np.int64) for n in names}
        for spec, a, b in zip(self.component.outputs, free, session.run(None, feeds)):
            if not np.array_equal(a.numpy(), np.asarray(b)):
                raise ValueError(f"{self.component.name}: the teacher-forced graph does not reproduce its own {spec.name}")

    def to_json(self) -> dict:
        return {"source": self.label, **self.details}
