"""ExecuTorch `.pte` with the XNNPACK delegate.

fp16 converts the module (ExecuTorch's own LLM export does the same: there is no fp16 switch on the
partitioner). 8da8w / 8da4w use torchao's dynamic-activation int schemes on linear layers, as
ExecuTorch's LLM export does; layers matching the component's `float_only` patterns stay in float.
`w8` (int8 weight-only) is offered on purpose: it lowers and runs
but XNNPACK returns wrong numbers (docs/toolchains.md), and the parity gate is what must catch it.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext
from fnmatch import fnmatch
from pathlib import Path
from typing import TYPE_CHECKING

from . import EXPORTERS
from ..patches.executorch import (decompose_only_what_is_left, edge_compile_config, lowering_decompositions, no_ir_validity_checks,
                                  partitions_share_weights, retrace_changed_graphs_only, skip_passes_with_nothing_to_rewrite)
from ..patches.torch_fx import no_stack_traces, provenance_by_reference
from .base import ExportResult, Exporter, cast_inputs, float_dtype, module_in, warm_up_module
from .xnnpack_rewrites import last_axis_reductions_as_pooling, norm_decompositions

if TYPE_CHECKING:
    from torch import nn

    from ..component import Component


def _quantize(module: nn.Module, precision: str, float_only: tuple[str, ...]) -> None:
    import torch
    from torch import nn
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerAxis, PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig, Int8WeightOnlyConfig

    configs = {
        "8da8w": lambda: Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8, weight_granularity=PerAxis(0)),
        "8da4w": lambda: Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)),
        "w8": Int8WeightOnlyConfig,
    }
    quantize_(module, configs[precision](), filter_fn=lambda m, fqn: quantizable(m, fqn, float_only))


def quantizable(module: nn.Module, fqn: str, float_only: tuple[str, ...]) -> bool:
    """Whether torchao quantizes this layer here: a linear layer whose input divides into groups of
    32 and that no `float_only` pattern keeps in float."""
    from torch import nn

    return isinstance(module, nn.Linear) and module.in_features % 32 == 0 and not any(fnmatch(fqn, p) for p in float_only)


def _xnnpack_ready(program, precision: str):
    """The exported program with the rewrites that let XNNPACK take more of it in fewer, larger
    partitions (lowering time grows with partitions x graph size). Float programs also get
    executorch's constant propagation: subgraphs that read only constants (baked time embeddings,
    masks and position tables built from `arange`) become stored constants instead of nodes the
    partitioner must refuse. Quantized programs skip it: it would fold each weight's dequantize
    into a float constant and undo the scheme. Propagation runs on the functionalized program: in
    torch.export's graph an in-place op may still write to a tensor that only looks constant
    (a VLA's Euler loop: "constant ... is mutated in the forward method")."""
    if precision in ("fp32", "fp16"):
        from executorch.exir.passes.constant_prop_pass import constant_prop_pass

        # Reductions the module writes are pooled before the decomposition, which then settles the
        # rewrite's reshapes; only those the decomposition itself writes (a LayerNorm's means) are
        # left for after, and make the lowering decompose again.
        last_axis_reductions_as_pooling(program)
        program = constant_prop_pass(program.run_decompositions(_lowering_decompositions()))
        _compact_view_constants(program)
    last_axis_reductions_as_pooling(program)
    return program


def _lowering_decompositions() -> dict:
    """The table ExecuTorch's lowering decomposes with for XNNPACK, with the norm rewrite: decomposed
    here in the one pass the constant propagation needs anyway, the lowering's own passes find
    nothing left to decompose and skip theirs (`decompose_only_what_is_left`)."""
    return lowering_decompositions(norm_decompositions())


def _compact_view_constants(program) -> None:
    """Constant propagation folds a slice of a weight (`in_proj_weight[d:2 * d]`, the key rows of a
    packed attention projection) into a constant that is a view into the weight's storage; XNNPACK's
    serializer writes such a constant from the start of its storage, so the key and value projections
    of a one-pass action policy's attention ran with the query rows (a .pte at -0.8 dB against its own module). Every
    constant that is a view becomes a compact copy of its own."""
    import torch

    for store in (program.state_dict, program.constants):
        for name, tensor in list(store.items()):
            if not isinstance(tensor, torch.Tensor) or tensor.is_meta:
                continue
            if tensor.storage_offset() or not tensor.is_contiguous() or tensor.untyped_storage().nbytes() != tensor.nbytes:
                copy_ = tensor.detach().contiguous().clone()
                store[name] = torch.nn.Parameter(copy_, requires_grad=False) if isinstance(tensor, torch.nn.Parameter) else copy_


def prepare(component: Component, precision: str) -> tuple[nn.Module, tuple]:
    """A copy of the component's module in the requested precision, and matching example inputs."""
    module = copy.deepcopy(component.module).eval()
    dtype = float_dtype(precision)
    if precision == "fp16":
        module = module.to(dtype)
    elif precision != "fp32":
        _quantize(module, precision, component.float_only)
    return module, cast_inputs(component.example_inputs, dtype)


def _constant_data(path: Path):
    """A `.pte`'s program (its flatbuffer, without the data segments) and `constant(index)`, the
    bytes of `constant_buffer[index]`, read from a memory map of the file. ExecuTorch's own
    `deserialize_pte_binary` takes the whole file as bytes and copies every segment out of it:
    three copies of a 1.7b model's weights to find one embedding table. Constants live either in
    the flatbuffer (`constant_buffer`) or, as the serializer writes them by default, in the
    constant segment at `constant_segment.offsets`, as `_restore_constant_segment` reads them."""
    from .xnnpack_weights import program_segments

    program, segment = program_segments(path)
    constants = program.constant_segment
    if segment is None or constants is None or not constants.offsets:
        return program, lambda index: program.constant_buffer[index].storage
    data = segment(constants.segment_index)
    ends = [*constants.offsets[1:], len(data)]
    return program, lambda index: data[constants.offsets[index] : ends[index]]


@EXPORTERS.register("executorch")
class ExecuTorchExporter(Exporter):
    name = "executorch"
    format = "pte"
    backend = "xnnpack"
    extension = ".pte"
    runtime = "executorch"
    precisions = ("fp32", "fp16", "8da8w", "8da4w", "w8")
    schemes = {  # what each precision means in this format, one line each (edgex list)
        "fp32": "float32 weights and compute on XNNPACK",
        "fp16": "the module cast to float16: fp16 weights, compute, inputs and outputs",
        "8da8w": "torchao: int8 weights per output channel, activations quantized to int8 per token at run time",
        "8da4w": "torchao: int4 weights in groups of 32, activations quantized to int8 per token at run time",
        "w8": "torchao int8 weight-only (per channel), float compute; XNNPACK 1.5.1 returns wrong numbers, the gate fails it",
    }
    requires = ("executorch", "torchao")

    def stored_scheme(self, component: Component, precision: str, files: list[Path], **_options):
        """Read from the file: every quantized weight of the XNNPACK delegates (`xnnpack_weights`),
        dequantized as XNNPACK reads it (codes x the scales the file stores: float32 per channel,
        bfloat16 per group of 32), swapped in for the linear layer's weight it holds (paired by
        content, `_file_weights`). torchao is not run. The 8da schemes quantize each quantized
        layer's input per token to int8 (asymmetric) at run time; that is applied as fake
        quantization."""
        import torch

        from ..parity.scheme import DYNAMIC, ActivationQuant, StoredScheme, StoredWeight

        if precision in ("fp32", "fp16"):
            return super().stored_scheme(component, precision, files)
        try:
            paired = self._file_weights(component, files)
        except ValueError as error:  # a layout `xnnpack_weights` does not read
            return self._independent_scheme(component, precision, f"the file's weights not read back: {error}")
        weights, activations, notes = {}, {}, []
        for key, stored, param, module in paired:
            if param is None:
                notes.append(f"quantized weight {key} of the file holds no linear layer's weight of the component")
                continue
            weights[param] = StoredWeight(component.module.get_parameter(param).detach(), torch.from_numpy(stored.weight))
            if precision.startswith("8da"):
                activations[module] = ActivationQuant(DYNAMIC, bits=8)
        return StoredScheme("read from the file (XNNPACK delegates' quantized weights)", weights, activations, notes)

    @staticmethod
    def _independent_scheme(component: Component, precision: str, why: str):
        """The independent quantizer's torchao scheme (`edgex.parity.quantizer`) applied to every
        layer torchao quantizes here, for a file whose weights cannot be read back; labelled so."""
        import torch

        from ..parity.quantizer import fake_quantize, scheme_for
        from ..parity.scheme import DYNAMIC, ActivationQuant, StoredScheme, StoredWeight, called_modules

        scheme = scheme_for("executorch", precision)
        names = {id(p): n for n, p in component.module.named_parameters()}
        weights, activations = {}, {}
        for module in sorted(called_modules(component)):
            layer = component.module.get_submodule(module)
            if scheme is None or not quantizable(layer, module, component.float_only):
                continue
            original = layer.weight.detach()
            weights[names[id(layer.weight)]] = StoredWeight(original, torch.from_numpy(fake_quantize(original.float().numpy(), scheme)))
            if precision.startswith("8da"):
                activations[module] = ActivationQuant(DYNAMIC, bits=8)
        return StoredScheme(f"independent quantizer's {scheme.name if scheme else precision} scheme ({why})", weights, activations)

    def stored_quantized(self, component: Component, files: list[Path], precision: str, **_options):
        """Every quantized weight of the XNNPACK delegates, dequantized from the file, beside the
        eager weight of the linear layer it holds (`_file_weights`), to be scored against the
        independent quantizer's torchao scheme (with the bfloat16 scales XNNPACK stores for groups)."""
        import numpy as np

        from ..parity.quantized import QuantizedTensor
        from ..parity.quantizer import scheme_for

        scheme = scheme_for(self.name, precision)
        if scheme is None:
            return None
        try:
            paired = self._file_weights(component, files)
        except ValueError as error:  # a layout `xnnpack_weights` does not read: unverified, never guessed
            return f"quantized weights of {files[0].name} not read back: {error}"
        found = {}
        for key, stored, param, _module in paired:
            name = param or f"xnnpack weight {key}"
            if name in found:
                name = f"{name} (again, {key})"
            original = (component.module.get_parameter(param).detach().float().numpy() if param is not None
                        else np.zeros((0,), np.float32))
            found[name] = QuantizedTensor(stored.weight, original, scheme)
        return found

    def _file_weights(self, component: Component, files: list[Path]):
        """(named data key, `XnnpackWeight`, the parameter name of the linear weight it holds or
        None, a module name that calls it) for every quantized weight of the file. The file keys
        its weights by a hash of their bytes, so each is paired with a linear layer the graph calls
        by content (`edgex.parity.quantized.paired_by_content`)."""
        from ..parity.quantized import paired_by_content
        from ..parity.scheme import called_modules
        from .xnnpack_weights import quantized_weights

        names = {id(p): n for n, p in component.module.named_parameters()}
        linears: dict[str, str] = {}  # parameter name -> a module calling it
        for module in sorted(called_modules(component)):
            weight = component.module.get_submodule(module).weight
            linears.setdefault(names[id(weight)], module)
        stored = quantized_weights(files[0])
        pairs = paired_by_content({k: w.weight for k, w in stored.items()},
                                  {n: component.module.get_parameter(n).detach().float().numpy() for n in linears})
        out = []
        for key, weight in stored.items():
            hit = pairs[key]
            param = hit[0] if hit is not None and not hit[1] else None  # XNNPACK's linear weights are [out, in]
            out.append((weight.key[:12], weight, param, linears.get(param)))
        return out

    def stored_constants(self, component: Component, files: list[Path], precision: str, **_options):
        """The program's constant tensors (those outside the XNNPACK delegate, such as a gather's
        table) that can be one of the component's tables: a `Tensor` value with a data buffer and
        no memory-plan allocation is a constant of `constant_buffer`. Read from a memory map of
        the `.pte` (`_constant_data`), so only those tensors' bytes are read."""
        import numpy as np
        from executorch.exir.schema import ScalarType, Tensor

        from ..parity.tensors import may_hold_table

        dtypes = {ScalarType.FLOAT: np.float32, ScalarType.HALF: np.float16}
        program, constant = _constant_data(files[0])
        arrays = {}
        for p, plan in enumerate(program.execution_plan):
            for i, value in enumerate(plan.values):
                t = value.val
                if not isinstance(t, Tensor) or t.data_buffer_idx <= 0 or t.allocation_info is not None:
                    continue
                dtype = dtypes.get(t.scalar_type)
                if dtype is None or not may_hold_table(t.sizes, component.tables):
                    continue
                count = int(np.prod(t.sizes, dtype=np.int64))
                data = np.frombuffer(constant(t.data_buffer_idx), dtype, count)
                arrays[f"{plan.name}.values[{i}]"] = data.reshape(t.sizes).astype(np.float32)
        return arrays

    def warm_up(self) -> None:
        import torch
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower
        from executorch.runtime import Runtime

        super().warm_up()
        Runtime.get()
        module, inputs = warm_up_module()
        with torch.no_grad():
            to_edge_transform_and_lower(torch.export.export(module, inputs), partitioner=[XnnpackPartitioner()]).to_executorch()

    def export(self, component: Component, precision: str, dest: Path) -> ExportResult:
        import torch
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import to_edge_transform_and_lower

        dtype = float_dtype(precision)
        # fp32 / fp16 lower the component's own module (cast in place, restored after) rather than a
        # deep copy of it; the quantized schemes rewrite their copy's layers.
        with torch.no_grad(), provenance_by_reference(), no_stack_traces(), decompose_only_what_is_left(), \
                (module_in(component, dtype) if precision in ("fp32", "fp16") else nullcontext()) as module:
            if module is None:
                module, _ = prepare(component, precision)
            program = _xnnpack_ready(torch.export.export(module, cast_inputs(component.example_inputs, dtype), strict=False),
                                     precision)
            del module
            with partitions_share_weights(), retrace_changed_graphs_only(), no_ir_validity_checks():
                lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()],
                                                      compile_config=edge_compile_config())
            del program
            delegated = sum(1 for n in lowered.exported_program().graph.nodes if n.target == torch.ops.higher_order.executorch_call_delegate)
            with skip_passes_with_nothing_to_rewrite():
                program = lowered.to_executorch()
            del lowered
            # Written piece by piece from the serializer's chunks: `.buffer` joins them into one bytes
            # object first, another copy of every weight at the export's peak.
            with open(dest, "wb") as f:
                program.write_to_file(f)
        return ExportResult(
            [dest],
            str(float_dtype(precision)).removeprefix("torch."),
            {"delegate_subgraphs": delegated},
        )
