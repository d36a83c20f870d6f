"""ONNX via torch.export (the dynamo exporter), weights in one external-data file beside it.

fp16 exports the half-precision module, so the graph computes in fp16 end to end (float inputs
and outputs are float16), which is what an fp16 ONNX deployment runs.

8da8w / 8da4w rewrite the fp32 graph's linear layers into ONNX Runtime's `MatMulNBits` contrib op
with its own quantizer (`onnxruntime.quantization.matmul_nbits_quantizer`): int8 / int4 weights in
blocks of `NBITS_BLOCK` along the input (int8 symmetric, int4 with a zero point per block), and `accuracy_level` 4, the kernels that quantize
the activations to int8 per block at run time and take integer dot products (MLAS CompInt8). On a
2-core AVX2 host the fp32-activation kernels (level 0) ran 30-500x slower on a 1-token matmul, so
level 4 is what a CPU deployment uses; the scheme reference models its activation quantization.
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from . import EXPORTERS
from ..patches.torch_fx import no_stack_traces, provenance_by_reference
from ..patches.onnxscript import constant_folding_pass, default_rewrite_rules
from ..patches.torch_onnx import torchlib_registry_built_once
from .base import ExportResult, Exporter, cast_inputs, float_dtype, module_in, warm_up_module
from .onnx_fusions import fuse_for_onnxruntime

if TYPE_CHECKING:
    from ..component import Component


# MatMulNBits (8da8w / 8da4w)
NBITS = {"8da8w": 8, "8da4w": 4}
NBITS_BLOCK = 32  # weights per block along the input dimension (and the activations' block at level 4)
# int4 blocks carry a zero point (ONNX Runtime's default; 4 more bits per block of 32): on the 0.6b
# predictor frame, 24 frames, symmetric int4 flipped one greedy code beyond the tie rule (margin
# 1.05x the tie margin) where asymmetric int4 kept every flip a tie (worst 0.73x), at 1.1x the
# symmetric frame's time. int8 stays symmetric.
NBITS_SYMMETRIC = {8: True, 4: False}
ACCURACY_LEVEL = 4  # MatMulNBits: int8 activations, integer dot products
LINEAR_PREFIX = "edgex.linear."  # a quantized weight's initializer is named after its nn.Linear


@EXPORTERS.register("onnx")
class OnnxExporter(Exporter):
    name = "onnx"
    format = "onnx"
    backend = "onnxruntime-cpu"
    extension = ".onnx"
    runtime = "onnxruntime"
    precisions = ("fp32", "fp16", "8da8w", "8da4w")
    schemes = {  # what each precision means in this format, one line each (edgex list)
        "fp32": "float32 graph",
        "fp16": "the module cast to float16: fp16 weights and compute end to end, fp16 inputs and outputs",
        "8da8w": f"MatMulNBits: int8 weights, symmetric blocks of {NBITS_BLOCK} along the input, on the linear layers the "
                 f"graph calls; activations quantized to int8 per block at run time (accuracy_level 4); the rest fp32",
        "8da4w": f"MatMulNBits: int4 weights, blocks of {NBITS_BLOCK} along the input with a scale and a zero point, on the linear layers the "
                 f"graph calls; activations quantized to int8 per block at run time (accuracy_level 4); the rest fp32",
    }
    requires = ("onnx", "onnxscript")

    def stored_constants(self, component: Component, files: list[Path], precision: str, **_options):
        """The graph's float initializers and Constant-node values that can be one of the
        component's tables, read by onnx; only those initializers' external data is loaded."""
        import numpy as np
        import onnx
        from onnx import numpy_helper
        from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

        from ..parity.tensors import may_hold_table

        graph = onnx.load(str(files[0]), load_external_data=False).graph
        arrays = {}
        for init in graph.initializer:
            if not may_hold_table(init.dims, component.tables):
                continue
            if uses_external_data(init):
                load_external_data_for_tensor(init, str(files[0].parent))
            arrays[init.name] = numpy_helper.to_array(init)
        for node in graph.node:
            if node.op_type == "Constant":
                arrays.update({out: numpy_helper.to_array(a.t) for out in node.output for a in node.attribute if a.name == "value"})
        return {name: a.astype(np.float32) for name, a in arrays.items()
                if a.dtype.kind == "f" and may_hold_table(a.shape, component.tables)}

    def export(self, component: Component, precision: str, dest: Path) -> ExportResult:
        """The ONNX Runtime artifact: `graph` with every stacked input sliced (`slice_stacked_inputs`)
        and edgex's transformer pieces fused into ONNX Runtime's kernels (`onnx_fusions`)."""
        if precision in NBITS:
            with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
                source = self.export(component, "fp32", Path(tmp) / dest.name)
                details = quantize_matmuls(source.files[0], dest, component, NBITS[precision])
            details |= {k: v for k, v in source.details.items() if k == "sliced_inputs" or k.startswith("fused_")}
            data = dest.with_name(dest.name + ".data")
            return ExportResult([dest] + ([data] if data.exists() else []), "float32", details)
        return self.graph(component, precision, dest, for_onnxruntime=True)

    def warm_up(self) -> None:
        import onnxruntime
        import torch

        super().warm_up()
        module, inputs = warm_up_module()
        with tempfile.TemporaryDirectory() as tmp, torch.no_grad(), torchlib_registry_built_once():
            torch.onnx.export(module, inputs, f"{tmp}/warm_up.onnx", dynamo=True, verbose=False)
            onnxruntime.InferenceSession(f"{tmp}/warm_up.onnx", providers=["CPUExecutionProvider"])

    def graph(self, component: Component, precision: str, dest: Path, for_onnxruntime: bool = False) -> ExportResult:
        """The component's float ONNX graph with its declared inputs (what the QNN and MNN
        converters start from)."""
        import torch

        from .onnx_weights import write_strided_weights_row_major

        dtype = float_dtype(precision)
        inputs = cast_inputs(component.example_inputs, dtype)
        for name in ("torch.onnx", "onnxscript"):
            logging.getLogger(name).setLevel(logging.ERROR)
        with torch.no_grad(), provenance_by_reference(), no_stack_traces(), module_in(component, dtype) as module, \
                torchlib_registry_built_once():
            program = torch.onnx.export(
                module,
                inputs,
                dynamo=True,
                input_names=[s.name for s in component.inputs],
                output_names=[s.name for s in component.outputs],
                optimize=False,
                verbose=False,
            )
            optimize(program.model)  # the program still reads the module's tensors: save before they are restored
            drop_source_locations(program.model)
            sliced, fused = (slice_stacked_inputs(program.model), fuse_for_onnxruntime(program.model)) if for_onnxruntime else ({}, {})
            write_strided_weights_row_major(program.model)
            program.save(str(dest), external_data=True)
        data = dest.with_name(dest.name + ".data")
        files = [dest] + ([data] if data.exists() else [])
        # from the IR model: `program.model_proto` serializes the whole model, weights included (13 s
        # of the 0.6b talker's export), to read one number
        imports = program.model.opset_imports
        opset = imports.get("", next(iter(imports.values()), None))
        return ExportResult(files, str(dtype).removeprefix("torch."), {"opset": opset} | ({"sliced_inputs": sliced} if sliced else {}) | fused)

    def stored_scheme(self, component: Component, precision: str, files: list[Path], **_options):
        """Read from the file: every MatMulNBits weight dequantized as the op defines it
        ((code - zero point) x block scale), paired with the linear layer it was made from (the
        export names the weight after it, `LINEAR_PREFIX` + module path); with accuracy_level 4 the
        layer's input is quantized to int8 per block, symmetric, as MLAS does before its integer dot
        products."""
        if precision not in NBITS:
            return super().stored_scheme(component, precision, files)
        return read_matmul_nbits(component, files[0])

    def stored_quantized(self, component: Component, files: list[Path], precision: str, **_options):
        """Every MatMulNBits weight, read from the file (`matmul_nbits_quantized`)."""
        return matmul_nbits_quantized(component, files[0], precision) if precision in NBITS else None


SLICED_INPUTS = "edgex.sliced_inputs"  # model metadata: JSON {input name: slices along axis 0}


def slice_stacked_inputs(model) -> dict[str, int]:
    """Feed each stacked input (a KV cache [layers, ...]) as one graph input per slice along axis 0.

    The exported graph reads layer i of `past_key` with `Gather(past_key, i)`, which ONNX Runtime
    runs as one Split copying the whole cache on every call (the 0.6b talker step: 59 MB per cache
    input, a quarter of its kernel time in the profile). Inputs `NAME.0` .. `NAME.{n-1}` (shape
    without the stacked axis) take the place of `NAME`, and the runtime feeds views of the stacked
    array, so nothing is copied. Only an input read by nothing but constant-index Gathers on axis 0
    that cover every slice is rewritten; `SLICED_INPUTS` in the model's metadata names them (in
    the component's input order, so a runner can feed the stacked arrays it already has)."""
    import json

    import onnx_ir as ir

    graph, sliced = model.graph, {}
    for position, value in reversed(list(enumerate(graph.inputs))):
        readers = _slice_readers(value)
        if readers is None:
            continue
        parts = []
        for index in range(value.shape[0]):
            part = ir.Value(name=f"{value.name}.{index}", shape=ir.Shape(value.shape[1:]), type=value.type)
            for node in readers[index]:
                node.outputs[0].replace_all_uses_with(part)
                graph.remove(node, safe=True)
            parts.append(part)
        graph.inputs[position : position + 1] = parts
        sliced[value.name] = len(parts)
    if sliced:
        model.metadata_props[SLICED_INPUTS] = json.dumps(dict(reversed(sliced.items())))
    return dict(reversed(sliced.items()))


def sliced_inputs_of(path: Path) -> dict[str, int]:
    """{stacked input: slices} of an ONNX file `slice_stacked_inputs` rewrote ({} for any other)."""
    import json

    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return json.loads({p.key: p.value for p in model.metadata_props}.get(SLICED_INPUTS, "{}"))


def sliced_feed(arrays: dict, sliced: dict[str, int]) -> dict:
    """Inputs by name as the file takes them: each stacked array `sliced` names becomes its slices
    (views, not copies) under `NAME.i`; every other array as it is."""
    feed = {}
    for name, array in arrays.items():
        feed.update({f"{name}.{i}": array[i] for i in range(sliced[name])} if name in sliced else {name: array})
    return feed


def _slice_readers(value) -> dict[int, list] | None:
    """{slice index: the Gathers reading it} when every use of `value` is a Gather on axis 0 with a
    constant scalar index and every slice is read; else None."""
    shape = value.shape
    if shape is None or len(shape) < 2 or not isinstance(shape[0], int) or not value.uses():
        return None
    readers: dict[int, list] = {}
    for node, slot in value.uses():
        axis = node.attributes.get("axis")
        index = node.inputs[1].const_value if node.op_type == "Gather" and node.domain == "" and slot == 0 else None
        if index is None or (axis is not None and axis.value != 0) or index.shape.dims != ():
            return None
        readers.setdefault(int(index.numpy()) % shape[0], []).append(node)
    return readers if len(readers) == shape[0] else None


def _linear_of(node, linears: set[str]) -> str | None:
    """The nn.Linear module (of `linears`) whose call emitted this ONNX node, from its name scopes."""
    scopes = next((ast.literal_eval(p.value) for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), [])
    return next((s for s in reversed(scopes) if s in linears), None)


def quantize_matmuls(source: Path, dest: Path, component: Component, bits: int) -> dict:
    """Rewrite the fp32 ONNX graph at `source` into `dest` (+ `.data`) with every MatMul that an
    nn.Linear of the component emitted (not `float_only`, input a multiple of `NBITS_BLOCK`) as a
    MatMulNBits. The weight initializers are first renamed after their layer, so the file says
    which layer each quantized tensor stands for; a layer called in several places (the predictor
    frame runs each layer 15 times) keeps one quantized copy."""
    import onnx

    from ..parity.scheme import called_modules

    nbits = _import_quantizer()
    linears = {n for n in called_modules(component) if not any(fnmatch.fnmatch(n, p) for p in component.float_only)}
    model = onnx.load(str(source))
    graph = model.graph
    _fold_weight_transposes(graph)
    shapes = {i.name: tuple(i.dims) for i in graph.initializer}
    renamed, excluded = {}, []
    for node in graph.node:
        if node.op_type != "MatMul":
            continue
        layer = _linear_of(node, linears)
        weight = node.input[1]
        shape = shapes.get(weight)
        if layer is None or shape is None or len(shape) != 2 or shape[0] % NBITS_BLOCK:
            excluded.append(node.name)
            continue
        renamed.setdefault(weight, LINEAR_PREFIX + layer)
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    for init in graph.initializer:
        init.name = renamed.get(init.name, init.name)
    quantizer = nbits.MatMulNBitsQuantizer(model, bits=bits, block_size=NBITS_BLOCK, is_symmetric=NBITS_SYMMETRIC[bits],
                                           accuracy_level=ACCURACY_LEVEL, nodes_to_exclude=excluded)
    quantizer.node_quantizer.qbits_block_quant = _once_per_weight(quantizer.node_quantizer.qbits_block_quant)
    quantizer.process()
    graph = quantizer.model.model.graph
    unique = {}
    for init in graph.initializer:  # the quantizer adds a copy per node that uses a weight
        unique.setdefault(init.name, init)
    graph.ClearField("initializer")
    graph.initializer.extend(unique.values())
    onnx.save(quantizer.model.model, str(dest), save_as_external_data=True, all_tensors_to_one_file=True,
              location=dest.name + ".data")
    quantized = sum(n.op_type == "MatMulNBits" for n in graph.node)
    return {"opset": model.opset_import[0].version, "op": "com.microsoft.MatMulNBits", "bits": bits,
            "block_size": NBITS_BLOCK, "symmetric": NBITS_SYMMETRIC[bits], "accuracy_level": ACCURACY_LEVEL,
            "quantized_matmuls": quantized, "quantized_weights": len(renamed), "float_matmuls": len(excluded)}


def _fold_weight_transposes(graph) -> None:
    """Replace each `Transpose(perm=[1, 0])` of a 2-D initializer that feeds a MatMul's weight input
    with the transposed initializer. onnxscript's constant folding leaves such a Transpose when the
    weight is larger than its size limit (8192 values) and has several consumers, which is every
    layer of the 0.6b predictor frame (one Transpose per weight, read by the 15 unrolled passes);
    the quantizer only rewrites a MatMul whose weight is an initializer, so without this those
    layers stayed fp32. The fp32 weight and its Transpose go when nothing else reads them."""
    from onnx import numpy_helper

    inits = {i.name: i for i in graph.initializer}
    producer = {out: node for node in graph.node for out in node.output}
    folded = {}
    for node in graph.node:
        transpose = producer.get(node.input[1]) if node.op_type == "MatMul" else None
        if transpose is None or transpose.op_type != "Transpose" or transpose.input[0] not in inits:
            continue
        perm = next((list(a.ints) for a in transpose.attribute if a.name == "perm"), [1, 0])
        weight = inits[transpose.input[0]]
        if perm != [1, 0] or len(weight.dims) != 2:
            continue
        if transpose.output[0] not in folded:
            array = numpy_helper.to_array(weight).T.copy()
            folded[transpose.output[0]] = numpy_helper.from_array(array, transpose.output[0] + ".folded")
            graph.initializer.append(folded[transpose.output[0]])
        node.input[1] = folded[transpose.output[0]].name
    read = _read_names(graph)
    dead = [producer[out] for out in folded if out not in read]
    for node in dead:
        graph.node.remove(node)
    drop_unread_initializers(graph, {node.input[0] for node in dead})


def _read_names(graph) -> set[str]:
    return {name for node in graph.node for name in node.input} | {o.name for o in graph.output}


def drop_unread_initializers(graph, names: set[str]) -> None:
    """Remove the initializers among `names` that no node and no graph output reads any more
    (after a rewrite pointed their readers at a replacement)."""
    read = _read_names(graph)
    kept = [i for i in graph.initializer if i.name in read or i.name not in names]
    graph.ClearField("initializer")
    graph.initializer.extend(kept)


def _import_quantizer():
    """onnxruntime's matmul_nbits_quantizer calls `logging.basicConfig(level=INFO)` when imported,
    which would print every later INFO record of any library in the process: undo that."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    from onnxruntime.quantization import matmul_nbits_quantizer

    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger(matmul_nbits_quantizer.__name__).setLevel(logging.WARNING)
    return matmul_nbits_quantizer


def _once_per_weight(quantize):
    """The quantizer quantizes a weight again for every node that reads it; same bytes, same result."""
    done = {}

    def once(weight):
        key = (weight.shape, hashlib.sha256(weight.tobytes()).digest())
        if key not in done:
            done[key] = quantize(weight)
        return done[key]

    return once


def matmul_nbits_weights(model):
    """(weight initializer name, dequantized [N, K] float32, node attributes) for each MatMulNBits
    weight of `model`, once per weight: (code - zero point) x block scale, as the op defines it."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    tensors = {i.name: i for i in model.graph.initializer}
    seen = set()
    for node in model.graph.node:
        if node.op_type != "MatMulNBits" or node.input[1] in seen:
            continue
        seen.add(node.input[1])
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        k, n, bits, block = attrs["K"], attrs["N"], attrs["bits"], attrs["block_size"]
        codes = _unpack(numpy_helper.to_array(tensors[node.input[1]]).reshape(n, -1), bits)
        scales = numpy_helper.to_array(tensors[node.input[2]]).astype(np.float32).reshape(n, -1)
        if len(node.input) > 3 and node.input[3]:  # one code per block, packed like the weights
            zero = _unpack(numpy_helper.to_array(tensors[node.input[3]]).reshape(n, -1), bits)[:, : scales.shape[1], None]
        else:
            zero = 2 ** (bits - 1)  # the op's default zero point (symmetric blocks)
        blocks = codes.reshape(n, scales.shape[1], block).astype(np.float32) - zero
        yield node.input[1], (blocks * scales[..., None]).reshape(n, -1)[:, :k].copy(), attrs


def _layer_of(weight: str) -> str | None:
    """The nn.Linear a MatMulNBits weight was made from (`LINEAR_PREFIX` + module path), or None."""
    return weight.removeprefix(LINEAR_PREFIX).rsplit("_Q", 1)[0] if weight.startswith(LINEAR_PREFIX) else None


def read_matmul_nbits(component: Component, path: Path):
    """The StoredScheme of a MatMulNBits file (see `OnnxExporter.stored_scheme`)."""
    import onnx
    import torch

    from ..parity.scheme import BLOCKWISE, ActivationQuant, StoredScheme, StoredWeight

    modules = dict(component.module.named_modules(remove_duplicate=False))  # a layer may be named by its alias
    weights, activations, notes = {}, {}, []
    for name, stored, attrs in matmul_nbits_weights(onnx.load(str(path))):
        layer = _layer_of(name)
        if layer is None or layer not in modules:
            notes.append(f"MatMulNBits weight {name} names no layer of the component")
            continue
        weights[f"{layer}.weight"] = StoredWeight(modules[layer].weight.detach(), torch.from_numpy(stored))
        if attrs.get("accuracy_level", 0) == ACCURACY_LEVEL:
            activations[layer] = ActivationQuant(BLOCKWISE, bits=8, block=attrs["block_size"])
    return StoredScheme("read from the file (MatMulNBits weights)", weights, activations, notes)


def matmul_nbits_quantized(component: Component, path: Path, precision: str) -> dict:
    """Every MatMulNBits weight of the file as a `QuantizedTensor` beside its layer's eager weight;
    a weight that names no layer of the component is compared with nothing (a zero-size original
    fails it)."""
    import numpy as np
    import onnx

    from ..parity.quantized import QuantizedTensor
    from ..parity.quantizer import scheme_for, with_block

    modules = dict(component.module.named_modules(remove_duplicate=False))
    scheme = scheme_for("onnx", precision)
    found = {}
    for name, stored, attrs in matmul_nbits_weights(onnx.load(str(path))):
        module = modules.get(_layer_of(name) or "")
        original = module.weight.detach().float().numpy() if module is not None else np.zeros((0,), np.float32)
        found[name] = QuantizedTensor(stored, original, with_block(scheme, attrs["block_size"]))
    return found


def _unpack(packed, bits: int):
    """MatMulNBits' uint8 storage -> one code per element (int4: low nibble first)."""
    import numpy as np

    return np.stack((packed & 0x0F, packed >> 4), axis=-1).reshape(packed.shape[0], -1) if bits == 4 else packed


# onnxscript's multi-output rewrite `SlicesSplit` (two Slices of one tensor -> one Split) matches
# every pair of Slice nodes: on the 15-step code predictor frame (6,000 nodes) it took 63 s of a
# 70 s rewrite pass, and the optimizer runs the pass twice (most of the frame's ONNX export time).
SKIPPED_REWRITES = frozenset({"SlicesSplit"})


def optimize(model) -> None:
    """What `torch.onnx.export(optimize=True)` runs (onnxscript's `optimize_ir`, then its ONNX
    fusions), with the default rewrite rules minus `SKIPPED_REWRITES`. The graph keeps two Slices
    where the skipped rule would write one Split: the same values, and every runtime has both ops.

    Folding and rewriting run once, where `optimize_ir` runs them until nothing changes (at most
    twice): a second round finds next to nothing left (on the speech graphs, one Identity in a
    vocoder, which every runtime's own optimizer drops) and costs as much as the first."""
    import onnx_ir as ir
    import onnx_ir.passes.common as common
    from onnxscript import rewriter
    from onnxscript.rewriter import onnx_fusions

    rules = [rule for rule in default_rewrite_rules() if rule.name not in SKIPPED_REWRITES]
    ir.passes.Sequential(
        common.InlinePass(),
        constant_folding_pass(),
        rewriter.RewritePass(rules),
        common.RemoveUnusedNodesPass(),
        common.RemoveUnusedFunctionsPass(),
        common.RemoveUnusedOpsetsPass(),
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.LiftSubgraphInitializersToMainGraphPass(),
        common.DeduplicateInitializersPass(),
        common.CommonSubexpressionEliminationPass(),
        common.OutputFixPass(),
        common.NameFixPass(),
    )(model)
    onnx_fusions.fuse(model)


# torch.onnx records, on every node, the Python stack that made it: absolute paths of this checkout
# and of site-packages. The same graph exported from two folders (two CI runners, two Ray nodes)
# would differ in its bytes; the module scopes (`pkg.torch.onnx.name_scopes`) stay.
SOURCE_LOCATION = "pkg.torch.onnx.stack_trace"


def drop_source_locations(model) -> None:
    import onnx_ir as ir

    graphs = [model.graph, *model.functions.values()]
    for graph in graphs:
        for node in ir.traversal.RecursiveGraphIterator(graph):
            node.metadata_props.pop(SOURCE_LOCATION, None)


def nodes_from_modules(path: Path, patterns: tuple[str, ...]) -> list[str]:
    """Names of the ONNX nodes the exporter emitted for modules whose path matches one of the
    fnmatch `patterns` (read from the `pkg.torch.onnx.name_scopes` metadata each node carries)."""
    import onnx

    if not patterns:
        return []
    found = []
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        scopes = next((ast.literal_eval(p.value) for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), [])
        if any(fnmatch.fnmatch(scope, pattern) for scope in scopes for pattern in patterns):
            found.append(node.name)
    return found
