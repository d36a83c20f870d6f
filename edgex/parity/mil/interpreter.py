"""Load the ML program of a saved `.mlpackage` and evaluate it op by op."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Sequence

import numpy as np

from .kernels import KERNELS, KernelUnsupported

INTERPRETER = "edgex-mil-interpreter"


class UnsupportedOp(Exception):
    """The program holds an op (or an argument combination) the interpreter cannot evaluate."""


def load_program(package: Path):
    """The package's `main` function as coremltools' MIL, read back from the files on disk."""
    import coremltools as ct
    from coremltools.converters.mil.frontend.milproto.load import load

    model = ct.models.MLModel(str(package), skip_model_load=True)
    spec = model.get_spec()
    program = load(spec, spec.specificationVersion, model.weights_dir)
    return program.functions["main"]


def _has_value_semantics(op) -> bool:
    from coremltools.converters.mil.mil.operation import Operation

    return type(op).value_inference is not Operation.value_inference


def program_op_types(function) -> Counter:
    return Counter(op.op_type for op in function.operations)


def _check(function) -> None:
    """Every op must be a const, have an edgex kernel, or carry value semantics in coremltools."""
    unknown = set()
    for op in function.operations:
        if op.blocks:
            unknown.add(f"{op.op_type} (control flow)")
        elif op.op_type != "const" and op.op_type not in KERNELS and not _has_value_semantics(op):
            unknown.add(op.op_type)
    if unknown:
        raise UnsupportedOp(f"{INTERPRETER} does not implement MIL op(s): {', '.join(sorted(unknown))}")


def _nptype(var):
    from coremltools.converters.mil.mil import types

    dtype = var.dtype
    return types.nptype_from_builtin(dtype) if not types.is_str(dtype) else None


def _as_declared(var, value):
    """Round a computed value to the output var's declared dtype (fp16 results are fp16)."""
    nptype = _nptype(var)
    if nptype is None:
        return value
    return np.asarray(value).astype(nptype, copy=False)


class MilInterpreter:
    """Runs one ML program. `run` takes inputs in declared order and returns outputs in order."""

    name = INTERPRETER

    def __init__(self, package: Path):
        self.function = load_program(package)
        _check(self.function)
        self.op_types = program_op_types(self.function)

    @property
    def input_names(self) -> list[str]:
        return list(self.function.inputs)

    @property
    def output_names(self) -> list[str]:
        return [v.name for v in self.function.outputs]

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        # coremltools logs a warning each time a folded value is narrowed to fp16: that rounding is
        # intended here (results are rounded to the op's declared dtype), so keep it quiet.
        logging.getLogger("coremltools").setLevel(logging.ERROR)
        if len(inputs) != len(self.function.inputs):
            raise ValueError(f"program takes {len(self.function.inputs)} inputs, got {len(inputs)}")
        env = {var.name: _as_declared(var, x) for var, x in zip(self.function.inputs.values(), inputs)}
        for op in self.function.operations:
            outputs = self._evaluate(op, env)
            for var, value in zip(op.outputs, outputs):
                env[var.name] = _as_declared(var, value)
        return [np.array(env[v.name]) for v in self.function.outputs]

    def _evaluate(self, op, env: dict) -> tuple:
        if op.op_type == "const":
            return (op.outputs[0].val,)
        values = {name: self._value(var, env) for name, var in op.inputs.items()}
        if op.op_type in KERNELS:
            args = dict(op.default_inputs().items()) | values
            try:
                return KERNELS[op.op_type](args)
            except KernelUnsupported as exc:
                raise UnsupportedOp(f"{INTERPRETER}: MIL op {op.op_type} with {exc}") from None
        return _by_definition(op, values)

    @staticmethod
    def _value(var, env: dict):
        if isinstance(var, (list, tuple)):
            return [env[v.name] for v in var]
        return env[var.name]


def _by_definition(op, values: dict) -> tuple:
    """Evaluate `op` by coremltools' own definition: rebuild it on constant inputs in a scratch
    function of the same opset, where the builder runs the op's `value_inference`."""
    from coremltools.converters.mil.mil import Builder as mb
    from coremltools.converters.mil.mil import Function

    def const(value):
        return mb.const(val=value)

    with Function({}, opset_version=op.opset_version):
        kwargs = {name: [const(v) for v in value] if isinstance(value, list) else const(value) for name, value in values.items()}
        built = getattr(mb, op.op_type)(**kwargs)
    outputs = built if isinstance(built, (list, tuple)) else (built,)
    results = tuple(v.val for v in outputs)
    if any(r is None for r in results):
        raise UnsupportedOp(f"{INTERPRETER}: coremltools' definition of MIL op {op.op_type} gave no value for these inputs")
    return results
