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
from .base import ExportResult, Exporter, cast_inputs, float_dtype, module_in

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
    def quantizable(m: nn.Module, fqn: str) -> bool:
        return isinstance(m, nn.Linear) and m.in_features % 32 == 0 and not any(fnmatch(fqn, p) for p in float_only)

    quantize_(module, configs[precision](), filter_fn=quantizable)


def prepare(component: Component, precision: str) -> tuple[nn.Module, tuple]:
    """A copy of the component's module in the requested precision, and matching example inputs."""
    module = copy.deepcopy(component.module).eval()
    dtype = float_dtype(precision)
    if precision == "fp16":
        module = module.to(dtype)
    elif precision != "fp32":
        _quantize(module, precision, component.float_only)
    return module, cast_inputs(component.example_inputs, dtype)


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
        """torchao (same config): a `.pte` keeps its weights inside XNNPACK's delegate blob, not
        readable here, but they are exactly what `prepare` makes, which is deterministic: quantize
        again with the very same function and read the dequantized weights back from torchao.
        The 8da schemes quantize each quantized layer's input per token to int8 (asymmetric) at
        run time; that is applied as fake quantization."""
        import torch
        from torchao.utils import TorchAOBaseTensor

        from ..parity.scheme import DYNAMIC, ActivationQuant, StoredScheme, StoredWeight, called_modules

        if precision in ("fp32", "fp16"):
            return super().stored_scheme(component, precision, files)
        quantized, _ = prepare(component, precision)
        graph_linears = called_modules(component)  # torchao also converts linears the graph never calls
        weights, activations = {}, {}
        for name, module in quantized.named_modules():
            weight = getattr(module, "weight", None)
            if isinstance(weight, TorchAOBaseTensor) and name in graph_linears:
                original = component.module.get_submodule(name).weight
                weights[f"{name}.weight"] = StoredWeight(original, weight.dequantize().to(torch.float32))
                if precision.startswith("8da"):
                    activations[name] = ActivationQuant(DYNAMIC, bits=8)
        return StoredScheme("torchao (same config)", weights, activations)

    def stored_constants(self, component: Component, files: list[Path], precision: str, **_options):
        """The program's constant tensors (those outside the XNNPACK delegate, such as a gather's
        table), read by ExecuTorch's own `.pte` deserializer: a `Tensor` value with a data buffer
        and no memory-plan allocation is a constant of `constant_buffer`."""
        import numpy as np
        from executorch.exir._serialize._program import deserialize_pte_binary
        from executorch.exir.schema import ScalarType, Tensor

        dtypes = {ScalarType.FLOAT: np.float32, ScalarType.HALF: np.float16}
        program = deserialize_pte_binary(files[0].read_bytes()).program
        arrays = {}
        for p, plan in enumerate(program.execution_plan):
            for i, value in enumerate(plan.values):
                t = value.val
                if not isinstance(t, Tensor) or t.data_buffer_idx <= 0 or t.allocation_info is not None:
                    continue
                dtype = dtypes.get(t.scalar_type)
                if dtype is None:
                    continue
                count = int(np.prod(t.sizes, dtype=np.int64))
                data = np.frombuffer(program.constant_buffer[t.data_buffer_idx].storage, dtype, count)
                arrays[f"{plan.name}.values[{i}]"] = data.reshape(t.sizes).astype(np.float32)
        return arrays

    def export(self, component: Component, precision: str, dest: Path) -> ExportResult:
        import torch
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower

        dtype = float_dtype(precision)
        # fp32 / fp16 lower the component's own module (cast in place, restored after) rather than a
        # deep copy of it; the quantized schemes rewrite their copy's layers.
        with torch.no_grad(), (module_in(component, dtype) if precision in ("fp32", "fp16") else nullcontext()) as module:
            if module is None:
                module, _ = prepare(component, precision)
            program = torch.export.export(module, cast_inputs(component.example_inputs, dtype), strict=False)
            del module
            # The edge-dialect IR verifier re-checks every op's dtypes after each pass: a third of the
            # lowering time of the unrolled predictor frame (251 -> 171 s), for a check that parity,
            # which runs the artifact, makes anyway.
            lowered = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()],
                                                  compile_config=EdgeCompileConfig(_check_ir_validity=False))
            del program
            delegated = sum(1 for n in lowered.exported_program().graph.nodes if n.target == torch.ops.higher_order.executorch_call_delegate)
            buffer = lowered.to_executorch().buffer
        dest.write_bytes(buffer)
        return ExportResult(
            [dest],
            str(float_dtype(precision)).removeprefix("torch."),
            {"delegate_subgraphs": delegated},
        )
