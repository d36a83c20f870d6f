"""Core ML `.mlpackage` (ML program) through coremltools' torch.export path.

`fp32` / `fp16` set the program's compute precision. `w8` and `w4` are weight-only compression by
`coremltools.optimize` on the fp16 program (what the Neural Engine runs): int8 per output channel
(`w8`) and int4 in blocks of 32 along the input dimension (`w4`), both symmetric linear, stored as
`constexpr_blockwise_shift_scale` ops (iOS 18 / macOS 15). Inputs and outputs stay float32 / int32.
Only weights are compressed: module parameters and tables made of their rows; a table computed from
the configuration (a RoPE table, a window) stays fp16 (`_computed_constants`).
A component's fp16 program is converted once and kept (the last component only): `w8` and `w4`
compress that program with the compression pass alone. A conversion runs ~90 MIL passes, each
followed by a validation of the whole program, which costs minutes on an unrolled loop graph
(a 10-step flow-matching chunk graph); compressing per precision costs one pass.

Two graph rewrites work around coremltools 9.0's torch frontend (tested with torch 2.7, not 2.13):
an integer `clamp(x, min)` becomes `clamp_min` (its `clamp` converter promotes ints to float and
then feeds float indices to `gather`), and a boolean `&` / `|` becomes `logical_and` / `logical_or`
(no converter).
The `fuse_linear_bias` pass is skipped: it crashes on a scalar added to a one-output linear.
"""

from __future__ import annotations

import copy
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from . import EXPORTERS
from ..patches.coremltools import compressed_program, main_operations
from .base import ExportResult, Exporter

if TYPE_CHECKING:
    import torch

    from ..component import Component

MINIMUM_DEPLOYMENT_TARGET = "iOS18"  # blockwise int4 and Core ML states need iOS 18 / macOS 15
W4_BLOCK = 32
_SKIPPED_PASSES = ["common::fuse_linear_bias"]


def _rewrite_for_coreml(program: torch.export.ExportedProgram) -> None:
    import torch

    # boolean operators coremltools has no converter for -> the logical ops it has; reciprocal -> pow -1
    logical = {torch.ops.aten.__and__.Tensor: torch.ops.aten.logical_and.default,
               torch.ops.aten.__or__.Tensor: torch.ops.aten.logical_or.default}
    for node in program.graph.nodes:
        if node.target == torch.ops.aten.clamp.default and not node.args[0].meta["val"].is_floating_point():
            low, high = (list(node.args[1:]) + [None, None])[:2]
            if low is not None and high is None:
                node.target, node.args = torch.ops.aten.clamp_min.default, (node.args[0], low)
            elif low is None and high is not None:
                node.target, node.args = torch.ops.aten.clamp_max.default, (node.args[0], high)
        elif node.target in logical:
            node.target = logical[node.target]
        elif node.target == torch.ops.aten.reciprocal.default and node.args[0].meta["val"].is_floating_point():
            # coremltools converts reciprocal to MIL `inverse`, whose default epsilon computes
            # 1 / (x + 1e-4): a VLA's RoPE frequencies 1 / theta^(2i/d) came out 1e-4 off and its
            # fp32 action step scored 53.7 dB. x^-1 is the exact reciprocal.
            node.target, node.args = torch.ops.aten.pow.Tensor_Scalar, (node.args[0], -1.0)
    program.graph_module.recompile()


def _compression(precision: str, kept: list[str]):
    """coremltools' weight compression for `precision`, leaving the constants `kept` in fp16."""
    import coremltools.optimize as cto

    if precision == "w8":
        op = cto.coreml.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int8", granularity="per_channel")
    else:
        op = cto.coreml.OpLinearQuantizerConfig(mode="linear_symmetric", dtype="int4", granularity="per_block",
                                                block_size=W4_BLOCK)
    return cto.coreml.OptimizationConfig(global_config=op, op_name_configs=dict.fromkeys(kept))


def _named_tensors(component: Component) -> list[tuple[str, object]]:
    """Every parameter and buffer of the module under each alias (a wrapper that holds a submodule
    under a second name, `transformer` for the decoder's `pre_transformer`, is exported under that
    name, which deduplicated names miss), as the converter spells them in a const's name (`p_<path>` /
    `b_<path>`), longest first."""
    module = component.module
    tensors = dict(module.named_parameters(remove_duplicate=False)) | dict(module.named_buffers(remove_duplicate=False))
    return sorted(((n.replace(".", "_"), t) for n, t in tensors.items()), key=lambda item: -len(item[0]))


def _module_tensor(named: list, const_name: str, numel: int):
    """The module tensor a const of the program was converted from: named in the const's name, with
    as many elements; None for a constant the converter computed (folded from several tensors, a
    zeros_like of a buffer), which stands for no one weight."""
    return next((t for n, t in named if n in const_name and t.numel() == numel), None)


def _computed_constants(component: Component, fp16_model) -> list[str]:
    """The fp16 program's constants that hold no weights: those that are no module tensor, and the
    module's buffers that are not made of its parameters' rows (a RoPE table, a window: computed
    from the configuration, where 8 or 4 bits would put the rounding into every position). They
    stay fp16, where the run covers them; what is compressed is what a scheme reference can model
    (`scheme.made_of_parameter_rows`), so none of it stands unmatched beside the file's weights."""
    from ..parity.scheme import made_of_parameter_rows

    named = _named_tensors(component)
    params = {id(p) for p in component.module.parameters()}
    consts = [op for op in main_operations(fp16_model) if op.op_type == "const" and getattr(op.val.val, "size", 1) > 1]
    tensors = {op.name: _module_tensor(named, op.name, op.val.val.size) for op in consts}
    buffers = {name: t.detach().float() for name, t in tensors.items() if t is not None and id(t) not in params}
    weights = made_of_parameter_rows(component.module, buffers)
    return [name for name, t in tensors.items() if t is None or (name in buffers and name not in weights)]


def _op_types(model) -> dict[str, int]:
    """Op type -> count in the saved program's main function (the interpreter must cover them)."""
    from collections import Counter

    return dict(sorted(Counter(op.op_type for op in main_operations(model)).items()))


def _convert(component: Component, precision: str):
    """torch.export -> the ML program in `precision` ("fp32" or "fp16" compute)."""
    import coremltools as ct
    import torch

    module = copy.deepcopy(component.module).eval()
    with torch.no_grad():
        program = torch.export.export(module, tuple(component.example_inputs), strict=False).run_decompositions({})
    _rewrite_for_coreml(program)
    pipeline = ct.PassPipeline.DEFAULT
    pipeline.remove_passes(_SKIPPED_PASSES)
    return ct.convert(
        program,
        convert_to="mlprogram",
        compute_precision=ct.precision.FLOAT32 if precision == "fp32" else ct.precision.FLOAT16,
        minimum_deployment_target=getattr(ct.target, MINIMUM_DEPLOYMENT_TARGET),
        pass_pipeline=pipeline,
        skip_model_load=True,
    )


_FP16: list = []  # [(component, weights key, its fp16 MLModel)]: the last component's, reused by its w8 / w4 jobs


def _weights_key(component: Component) -> tuple:
    """Changes when a tensor of the module is replaced or written in place (a test breaking a
    weight between two exports must not get the earlier program back)."""
    module = component.module
    return tuple((t.data_ptr(), t._version) for t in (*module.parameters(), *module.buffers()))


def _fp16_program(component: Component):
    key = _weights_key(component)
    if not (_FP16 and _FP16[0][0] is component and _FP16[0][1] == key):
        _FP16[:] = [(component, key, _convert(component, "fp16"))]
    return _FP16[0][2]


def _compressed(component: Component, fp16_model, precision: str):
    """The fp16 program with its weights (`_computed_constants` aside) compressed by coremltools'
    compression pass alone.
    `coremltools.optimize.coreml.linear_quantize_weights` would re-run the whole default pipeline
    on the result (minutes on a big graph, and the skipped pass's crash), so the pass is applied to
    the program read back from the model and converted with an empty main pipeline."""
    import coremltools as ct

    target = getattr(ct.target, MINIMUM_DEPLOYMENT_TARGET)
    program = compressed_program(fp16_model, _compression(precision, _computed_constants(component, fp16_model)), target.value)
    return ct.convert(program, convert_to="mlprogram", compute_precision=ct.precision.FLOAT32,  # already fp16: no cast pass
                      minimum_deployment_target=target, pass_pipeline=ct.PassPipeline.EMPTY, skip_model_load=True)


@EXPORTERS.register("coreml")
class CoreMLExporter(Exporter):
    name = "coreml"
    format = "mlpackage"
    backend = "coreml-mlprogram"
    extension = ".mlpackage"
    runtime = "coreml"
    precisions = ("fp32", "fp16", "w8", "w4")
    schemes = {  # what each precision means in this format, one line each (edgex list)
        "fp32": "ML program with float32 compute",
        "fp16": "ML program with float16 compute (weights and activations)",
        "w8": "int8 per-channel linear-symmetric weights (coremltools), float16 compute",
        "w4": "int4 weights in blocks of 32 (coremltools), float16 compute",
    }
    requires = ("coremltools",)

    def stored_scheme(self, component: Component, precision: str, files: list[Path], **_options):
        """Read from the file: every compressed weight (`constexpr_blockwise_shift_scale`) of the
        saved program, decompressed by coremltools' own definition, paired with the module tensor
        it was converted from (torch.export names it `p_<path>` / `b_<path>`, which the converter
        keeps in the const's name). The program computes in fp16: that rounding, and the fp16
        storage of the uncompressed constants, count as lowering."""
        import torch
        from coremltools.converters.mil.mil.ops.defs.iOS18 import compression

        from ..parity.scheme import StoredScheme, StoredWeight

        if precision not in ("w8", "w4"):
            return super().stored_scheme(component, precision, files)
        # every alias: a wrapper that holds a submodule under a second name (`transformer` for the
        # decoder's `pre_transformer`) is exported under that name, which deduplicated names miss
        named = _named_tensors(component)
        weights, unnamed = {}, []
        for op in self._compressed_ops(files):
            args = [op.inputs[n].val if n in op.inputs else None for n in ("data", "scale", "offset")]
            stored = torch.from_numpy(compression.constexpr_blockwise_shift_scale.decompress(*args).astype("float32"))
            original = _module_tensor(named, op.name, stored.numel())
            if original is None:
                unnamed.append(op.name)
                continue
            original = original.detach().float()
            if tuple(original.shape) != tuple(stored.shape):  # a transposed matmul weight, or a reshaped conv kernel
                transposed = original.ndim == 2 and tuple(original.t().shape) == tuple(stored.shape)
                original = original.t() if transposed else original.reshape(stored.shape)
            weights[op.name] = StoredWeight(original, stored)
        notes = [f"compressed constants with no module tensor named in them: {', '.join(unnamed)}"] if unnamed else []
        return StoredScheme("read from the file (constexpr_blockwise_shift_scale)", weights, notes=notes)

    def stored_quantized(self, component: Component, files: list[Path], precision: str, **_options):
        """Every compressed weight of the saved program (`constexpr_blockwise_shift_scale`), decompressed
        by coremltools' definition of the op, beside the module tensor it was converted from (as
        `stored_scheme` pairs them), laid out by the scales the file stores."""
        import numpy as np

        from ..parity.quantized import QuantizedTensor, blockwise
        from ..parity.quantizer import scheme_for, with_block

        if precision not in ("w8", "w4"):
            return None
        scheme = scheme_for(self.name, precision)
        stored = self.stored_scheme(component, precision, files).weights
        found = {}
        for op in self._compressed_ops(files):
            weight = stored.get(op.name)
            if weight is None:  # no module tensor named in it: compared with nothing, it fails
                found[op.name] = QuantizedTensor(np.zeros((1,), np.float32), np.zeros((0,), np.float32), scheme)
                continue
            scales = op.inputs["scale"].val.shape
            rows, block = blockwise(weight.stored.numpy(), scales)
            original, _ = blockwise(weight.original.detach().float().numpy(), scales)
            found[op.name] = QuantizedTensor(rows, original, with_block(scheme, block))
        return found

    @staticmethod
    def _compressed_ops(files: list[Path]):
        from ..parity.mil.interpreter import load_program
        from ..parity.runtimes.coreml import package_root

        return [op for op in load_program(package_root(files)).operations if op.op_type == "constexpr_blockwise_shift_scale"]

    def stored_constants(self, component: Component, files: list[Path], precision: str, **_options):
        """Every `const` of the saved ML program and every compressed constant (`constexpr_*`)
        decompressed by coremltools' own definition of the op (`materialized_val_inference`; its
        `value_inference` refuses them), read from the package on disk."""
        import numpy as np

        from ..parity.mil.interpreter import load_program
        from ..parity.runtimes.coreml import package_root

        arrays = {}
        for op in load_program(package_root(files)).operations:
            if op.op_type == "const" or op.op_type.startswith("constexpr_"):
                value = op.outputs[0].val if op.op_type == "const" else op.materialized_val_inference()
                value = value[0] if isinstance(value, tuple) else value
                if isinstance(value, np.ndarray) and value.dtype.kind == "f":
                    arrays[op.outputs[0].name] = value.astype(np.float32)
        return arrays

    def export(self, component: Component, precision: str, dest: Path) -> ExportResult:
        os.environ.setdefault("TQDM_DISABLE", "1")  # coremltools' progress bars would garble --json runs' stderr
        logging.getLogger("coremltools").setLevel(logging.ERROR)
        if precision in ("w8", "w4"):
            model = _compressed(component, _fp16_program(component), precision)
        else:
            model = _fp16_program(component) if precision == "fp16" else _convert(component, precision)
        model.save(str(dest))
        details = {
            "compute_precision": "float32" if precision == "fp32" else "float16",
            "minimum_deployment_target": MINIMUM_DEPLOYMENT_TARGET,
            "coreml_inputs": [i.name for i in model.get_spec().description.input],
            "coreml_outputs": [o.name for o in model.get_spec().description.output],
            "mil_ops": _op_types(model),
            # Components carry their KV cache as explicit inputs/outputs; Core ML states would need
            # the cache as a registered buffer in the recipe's graphs.
            "stateful_kv_cache": False,
        }
        if precision == "w4":
            details["block_size"] = W4_BLOCK
        return ExportResult([dest], "float32", details)
