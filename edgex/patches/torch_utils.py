"""torch.utils: the two private modules edgex reads (nothing replaced), `_python_dispatch` and `_pytree`.

This module is light: torch is imported inside.
"""

from __future__ import annotations

from .registry import READ, register


@register("torch_utils.dispatch_mode", kind=READ, checked={"torch": "2.13.0"},
          symbols=("torch.utils._python_dispatch.TorchDispatchMode",),
          saves="the base class of `parity.half_arithmetic.HalfAccumulation`, which sees every ATen call (below "
                "autograd and decompositions) to sum fp16 matrix products in an fp16 accumulator: the fp16 floor",
          no_op="never off: the floor is measured with it",
          upstream="`TorchDispatchMode` under a public name, as `torch.overrides.TorchFunctionMode` is "
                   "(torch's docs on extending PyTorch describe it, from its private module)")
def dispatch_mode() -> type:
    """torch's `TorchDispatchMode`, to subclass."""
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


@register("torch_utils.tree_leaves", kind=READ, checked={"torch": "2.13.0"},
          symbols=("torch.utils._pytree.tree_leaves",),
          saves="every tensor inside a torch function's arguments, however nested (lists, dicts, the containers "
                "torch and transformers register), for `component.tensors_read`",
          no_op="never off: what a component reads is found with it",
          upstream="a public pytree module (the functions `torch.export` and `torch.compile` flatten with)")
def tree_leaves(tree) -> list:
    """The leaves of `tree`, as torch flattens it."""
    from torch.utils._pytree import tree_leaves as leaves

    return leaves(tree)
