"""torch.fx: node provenance kept by reference while a module is exported and lowered.

This module is light: torch is imported inside.
"""

from __future__ import annotations

import copy

from .registry import SPEED_UP, register


@register("torch_fx.provenance_by_reference", kind=SPEED_UP, checked={"torch": "2.13.0"},
          symbols=("torch.fx.traceback.copy",),
          saves="the deep copy of every node's whole provenance history in each pass that re-creates a node: "
                "19.5% of the 0.6b talker decode .pte fp32 lowering's samples (py-spy)",
          no_op="a graph whose nodes carry no provenance (`from_node`) has nothing to copy",
          upstream="`NodeSource` could share its parents' records (nothing mutates one once built)")
def provenance_by_reference():
    """torch.fx node provenance kept by reference while a module is exported and lowered.

    Every node records the nodes it was made from (`node.meta["from_node"]`, a list of torch.fx
    `NodeSource`, each holding its own history). Each pass that re-creates a node starts a new
    `NodeSource` with a deep copy of the old node's whole history, which has grown by one level per
    earlier pass: py-spy, the 0.6b talker decode `.pte` fp32, 19.5% of the lowering's samples were
    that deepcopy (torch.onnx's export runs the same kind of passes). Nothing changes a `NodeSource`
    once made (torch sets its fields only when it builds one), so within this context the new one
    shares the old entries: the list is copied, not its contents. The history itself, and what
    ExecuTorch derives from it, is unchanged."""
    import types

    from torch.fx import traceback as fx_traceback

    fx_traceback.copy = types.SimpleNamespace(deepcopy=list, copy=copy.copy)
    try:
        yield
    finally:
        fx_traceback.copy = copy


@register("torch_fx.no_stack_traces", kind=SPEED_UP, checked={"torch": "2.13.0"},
          symbols=("torch.fx.config.do_not_emit_stack_traces",),
          saves="the Python stack torch.fx captures and symbolizes for every node it traces: 5-9% of a tiny "
                "qwen3-tts graph's ONNX export, 14% of its talker prefill .pte export (in-process A/B)",
          no_op="a module whose export traces no node: nothing to capture",
          upstream="torch.export could leave stack capture off unless a caller asks for it")
def no_stack_traces():
    """torch.fx's own switch (`torch.fx.config.do_not_emit_stack_traces`) on while a module is
    exported: no node records the Python stack that made it.

    torch.export and torch.onnx's decompositions trace every node through make_fx, which captures
    and symbolizes the calling stack for `node.meta["stack_trace"]` (torch's own config says what
    it costs). Error messages would name the source line; the files do not change: the ONNX
    exporter's copy of each stack (`pkg.torch.onnx.stack_trace`) is dropped before saving, the
    same graph exported from two folders differing in nothing else, and an ExecuTorch program
    stores no stack."""
    from torch.fx import config

    before = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = before
