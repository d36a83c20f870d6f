"""ExecuTorch runtime (the pybindings runtime with the XNNPACK backend registered)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Sequence

import numpy as np

from ...patches.executorch import runtime_threads
from ...toolchain import ensure_installed, native_output_silenced, version
from . import RUNTIMES
from .base import SMOKE_INPUT, Runtime, Session, check_smoke


class _Session(Session):
    def __init__(self, method):
        self._method = method

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        import torch

        outputs = self._method.execute([torch.from_numpy(np.ascontiguousarray(x)) for x in inputs])
        return [o.detach().numpy().copy() if hasattr(o, "numpy") else np.asarray(o) for o in outputs]


@RUNTIMES.register("executorch")
class ExecuTorchRuntime(Runtime):
    name = "executorch"
    requires = ("executorch",)
    required = True

    def load(self, files: list[Path], threads: int | None = None) -> Session:
        ensure_installed("executorch", "running .pte artifacts")
        with native_output_silenced():  # its C++ CPU probe prints a few lines on first load
            from executorch.runtime import Runtime as EtRuntime

        if threads:
            runtime_threads(threads)
        program = EtRuntime.get().load_program(Path(files[0]))
        return _Session(program.load_method("forward"))

    def accumulates_in_half(self) -> bool:
        return _accumulates_in_half()

    def smoke(self, workdir: Path) -> str:
        """Lowers x + 1 to XNNPACK the way the exporter does and runs the program: the pybindings
        runtime must load and the XNNPACK backend must be registered in it."""
        ensure_installed("executorch", "running .pte artifacts")
        import torch

        class AddOne(torch.nn.Module):
            def forward(self, x):
                return x + 1.0

        path = workdir / "smoke.pte"
        path.write_bytes(_xnnpack_program(AddOne(), (torch.from_numpy(SMOKE_INPUT),)))
        check_smoke(self.load([path], 1).run([SMOKE_INPUT]))
        return "ran an XNNPACK-delegated x + 1 program"

    def version(self) -> str | None:
        return version("executorch")


@cache
def _accumulates_in_half() -> bool:
    """Whether XNNPACK sums fp16 products in fp16 here: it picks its fp16 kernels by the CPU's
    features (AVX512-FP16, Arm's fp16 arithmetic: fp16 fused multiply-adds; elsewhere fp16 inputs
    converted and summed in fp32). Measured, not read from CPU flags: a 4096-wide fp16 linear layer
    delegated to XNNPACK, against its exact result. Summed in fp32, only the output's
    rounding to fp16 remains (~74 dB); in fp16, the running sum's rounding (~40 dB at this width)."""
    import torch

    from ..metrics import snr_db

    with native_output_silenced():
        from executorch.runtime import Runtime as EtRuntime
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(4096, 64, bias=False).half().eval()
    with torch.no_grad():
        layer.weight.copy_(torch.randn(64, 4096, generator=generator) * 0.02)
    x = torch.randn(1, 4096, generator=generator).half()
    out = EtRuntime.get().load_program(_xnnpack_program(layer, (x,))).load_method("forward").execute([x])[0]
    exact = x.double() @ layer.weight.detach().double().T
    return snr_db(exact.numpy(), out.double().numpy()) < 57.0


def _xnnpack_program(module, inputs: tuple) -> bytes:
    """`module` exported on `inputs` and delegated to XNNPACK with its partitioner: a `.pte` buffer."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    exported = torch.export.export(module, inputs, strict=False)
    return to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch().buffer
