"""What fp16 arithmetic alone costs a component, on runtimes that accumulate in fp16.

A runtime with native fp16 kernels (XNNPACK on CPUs with AVX512-FP16 or Arm's fp16 arithmetic, the
kernels a phone runs) sums a matrix product's terms in an fp16 accumulator, one fused multiply-add
at a time: each partial sum is rounded to 11 bits, and the error grows with the reduction length
(a single 1024-wide linear layer: ~46 dB, against ~74 dB for fp16 inputs summed in fp32). Runtimes
that compute fp16 ops in fp32 (ONNX Runtime's CPU kernels) do not lose this. A faithful fp16 graph
of a wide model therefore scores lower against eager on such a runtime than the fixed fp16 gate
assumes, and that noise is the arithmetic the target really does, not a broken lowering.

`floor_db` measures it on the component's own module and samples, independently of the artifact:
the module run twice in PyTorch, in fp32, and in fp16 with every matrix product accumulated in fp16
(`HalfAccumulation`); the lowest SNR of the second against the first over every sample and output
is the floor. A planted graph bug does not lower it: both runs use the same module, and the floor
measures how sensitive that computation is to fp16 accumulation, not how close it is to the
reference. Convolutions are not emulated (they are summed in fp32 here), so the floor of a
convolution stack is, if anything, high: its gate stays nearer the fixed one.
"""

from __future__ import annotations

import math

import torch

from ..component import Component
from ..patches.torch_utils import dispatch_mode
from .gates import HALF_ARITHMETIC_ALLOWANCE_DB, HALF_ARITHMETIC_MIN_DB, half_arithmetic_db, overridden
from .metrics import snr_db

_aten = torch.ops.aten


def _accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc [.., M, N] (fp16) plus a [.., M, K] @ b [.., K, N], one k at a time, each step an fp16
    fused multiply-add: the exact product added to the running sum, then rounded to fp16."""
    a, b = a.float(), b.float()
    for k in range(a.shape[-1]):
        acc = (acc.float() + a[..., :, k:k + 1] * b[..., k:k + 1, :]).half()
    return acc


class HalfAccumulation(dispatch_mode()):
    """fp16 matrix products (mm, addmm, bmm, baddbmm, and so every linear layer and matmul) summed
    in an fp16 accumulator inside this context; every other op, and every op on other dtypes, runs
    as PyTorch runs it. A bias starts the accumulator, as a fully connected kernel's does."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        half = all(isinstance(t, torch.Tensor) and t.dtype == torch.float16
                   for t in args[:3 if func in (_aten.addmm.default, _aten.baddbmm.default) else 2])
        if not half:
            return func(*args, **kwargs)
        if func in (_aten.mm.default, _aten.bmm.default):
            a, b = args
            return _accumulate(torch.zeros(*a.shape[:-1], b.shape[-1], dtype=torch.float16), a, b)
        if func in (_aten.addmm.default, _aten.baddbmm.default):
            bias, a, b = args
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
            if alpha != 1:
                a = a * alpha
            start = (bias * beta).half().expand(*a.shape[:-1], b.shape[-1])
            return _accumulate(start, a, b)
        return func(*args, **kwargs)


def floor_db(component: Component) -> float | None:
    """The lowest SNR over the component's samples and outputs of its module in fp16 with fp16
    accumulation against the same module in fp32; None where the module cannot run in fp16 in
    PyTorch (an op without a half kernel on this machine): then no floor is known."""
    from ..exporters.base import cast_inputs, module_in

    lowest = math.inf
    try:
        for inputs in component.samples.values():
            with torch.no_grad():
                full = component.module(*cast_inputs(inputs, torch.float32))
                with module_in(component, torch.float16) as module, HalfAccumulation():
                    half = module(*cast_inputs(inputs, torch.float16))
            for ref, out in zip(_flat(full), _flat(half)):
                if ref.is_floating_point():
                    lowest = min(lowest, snr_db(ref.float().numpy(), out.float().numpy()))
    except (RuntimeError, NotImplementedError):
        return None
    return lowest


def _flat(outputs) -> list[torch.Tensor]:
    return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


# Why an fp16 artifact on an fp16-summing runtime records no floor.
NOT_MEASURED = "passed its fixed gates: the floor, which can only lower them, was not measured"


def half_arithmetic_gates(component: Component, runtime, precision: str, overrides: dict[str, float] | None,
                          gate_db: float, lowering_db: float | None, measure_floor: bool = True) -> dict | None:
    """The fp16 artifact's gates on `runtime`, where it accumulates in fp16 and the component's floor
    is known: each fixed gate the user did not set, moved to `gates.half_arithmetic_db`. None where
    the gates stay as they are (another precision, a runtime that accumulates in fp32, no floor).
    `measure_floor` False (the artifact passed its fixed gates): the record says so, without a floor."""
    if precision != "fp16" or not runtime.accumulates_in_half():
        return None
    if not measure_floor:
        return {"accumulation": "fp16", "floor_db": None, "why": NOT_MEASURED}
    floor = floor_db(component)
    if floor is None:
        return None
    out = {"accumulation": "fp16", "floor_db": floor,
           "end_to_end_gate_db": gate_db if overridden(component.role, precision, overrides)
           else half_arithmetic_db(gate_db, floor)}
    if floor - HALF_ARITHMETIC_ALLOWANCE_DB < HALF_ARITHMETIC_MIN_DB:
        out["note"] = (f"fp16 sums on {runtime.name} alone hold this component at {floor:.1f} dB, too close to the "
                       f"band broken graphs score in: fp16 is too coarse for it on this runtime")
    if lowering_db is not None:
        out["lowering_gate_db"] = (lowering_db if overridden(component.role, precision, overrides, lowering=True)
                                   else half_arithmetic_db(lowering_db, floor))
    return out
