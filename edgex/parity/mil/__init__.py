"""A reference interpreter for Core ML ML programs, so a saved `.mlpackage` can be checked where
Core ML prediction cannot run (it is macOS-only).

The program is read back from the package on disk with coremltools' own MIL loader (the same one
`coremltools.optimize` uses), so what runs is exactly what was saved: its ops, its dtypes (an fp16
op computes and rounds in fp16) and its compressed weights, expanded by the program's own
(de)quantization ops. Ops are evaluated by coremltools' op definitions where they carry value
semantics (`value_inference`, the compile-time evaluator coremltools uses for constant folding) and
by edgex's own torch kernels where they do not (convolutions, SiLU, the constexpr decompressors).
An op neither covers raises `UnsupportedOp`: the parity check then reports method `none` naming
it, never a pass.
"""

from .interpreter import INTERPRETER, MilInterpreter, UnsupportedOp, program_op_types

__all__ = ["INTERPRETER", "MilInterpreter", "UnsupportedOp", "program_op_types"]
