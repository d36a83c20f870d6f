"""What the ExecuTorch re-trace patches (`edgex.patches.executorch`) read off a graph: whether a
pass changed it, whether a pass has anything to rewrite in it, whether a decomposition has anything
left to do. Reading only; the patches themselves live in `edgex.patches.executorch`.

This module is light: torch and executorch are imported inside.
"""

from __future__ import annotations

# ExportPass methods through which a pass rewrites nodes while it re-traces: a pass that overrides
# any of them changes the graph in the re-trace itself, which must therefore always run.
_TRACE_HOOKS = ("call_operator", "call_getitem", "call_sym", "call_cond", "call_map", "call_scan", "call_while",
                "call_submodule", "placeholder", "output", "on_attr", "inputs", "call_size_operator")


CHECKED = "edgex_checked"  # graph meta: the state of the graph when a pass manager last validated it


def graph_fingerprint(graph_module) -> list:
    """Each node's operation, name, target and arguments (other nodes by name): equal for two
    states of a graph exactly when no node was added, removed, re-targeted or re-wired."""
    from torch.fx import Node
    from torch.fx.node import map_aggregate

    def named(value):
        return ("node", value.name) if isinstance(value, Node) else value

    return [(n.op, n.name, n.target, map_aggregate(n.args, named), map_aggregate(n.kwargs, named)) for n in graph_module.graph.nodes]


def same(a: list, b: list) -> bool:
    try:
        return a == b
    except RuntimeError:  # an argument whose equality is not a bool (a tensor): take it as changed
        return False


def edits_before_retrace(pass_type: type) -> bool:
    """A pass that edits the graph in its own `call` and re-traces only to regenerate metadata."""
    from executorch.exir.pass_base import ExportPass

    return "call" in {name for cls in pass_type.__mro__ if cls is not ExportPass and issubclass(cls, ExportPass)
                      for name in vars(cls)} and all(getattr(pass_type, hook, None) is getattr(ExportPass, hook, None)
                                                      for hook in _TRACE_HOOKS)


def _single_kind_rewrites() -> dict:
    """ExecuTorch's passes that rewrite one kind of node only, all of it in the re-trace
    (`call_operator`), by what each rewrites: the transpose shorthand `aten.t` (into `t_copy`), view
    operators (into their `_copy` variants), symbolic scalars (into tensors), XNNPACK's revert of
    dim-order copies to memory-format ones, and the dim-order copies the edge-to-ExecuTorch step
    inserts before the few portable kernels that need a contiguous input."""
    import torch
    from executorch.exir.passes.dim_order_ops_registry import MemoryFormatOpsMap
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass
    from executorch.exir.passes.memory_format_ops_pass import DimOrderOpsRevertPass
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import ReplaceBrokenOpsWithFunctionalOpsPass
    from executorch.exir.passes.sym_to_tensor_pass import SymToTensorPass

    return {
        NormalizeTransposePass: lambda node: node.target == torch.ops.aten.t.default,
        ReplaceBrokenOpsWithFunctionalOpsPass: lambda node: isinstance(node.target, torch._ops.OpOverload) and node.target.is_view,
        SymToTensorPass: lambda node: isinstance(node.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool)),
        DimOrderOpsRevertPass: lambda node: node.target in MemoryFormatOpsMap,
        LegalizePortableDimOrderPass: lambda node: node.target in LegalizePortableDimOrderPass._target_ops,
    }


def _folds_a_constant(pass_, graph_module) -> bool:
    """Whether ExecuTorch's `ConstPropPass` could fold a node of `graph_module`. In its re-trace a
    node's value is a real tensor only for a graph attribute (`get_attr`) or a node it folded;
    placeholders, parameters included, are fake. It folds an operator whose arguments are all real,
    so the first node it could fold reads nothing but attributes (or nothing at all, as `full`
    does). Its variant that folds only quantize / dequantize nodes is not looked into: it always
    runs."""
    if getattr(pass_, "propogate_quant", True):
        return True
    return any(node.op == "call_function" and all(i.op == "get_attr" for i in node.all_input_nodes)
               for node in graph_module.graph.nodes)


def _casts_an_argument(_pass, graph_module) -> bool:
    """Whether ExecuTorch's `RemoveMixedTypeOperators` would cast an argument of a node of
    `graph_module`: as it does, for its binary operators (`add`, `sub`, `mul`, `div`, `minimum`),
    the dtype torch's promotion gives the positional arguments, and a cast before each
    tensor-typed argument not already of it. Any argument whose value this cannot see (a symbolic
    scalar, a node without metadata, a promotion that fails) counts as cast."""
    import operator

    import torch
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

    aten, kind = torch.ops.aten, ELEMENTWISE_TYPE_PROMOTION_KIND
    promotions = {aten.add.Tensor: kind.DEFAULT, aten.mul.Tensor: kind.DEFAULT, aten.sub.Tensor: kind.DEFAULT,
                  aten.div.Tensor: kind.INT_TO_FLOAT, aten.div.Tensor_mode: kind.DEFAULT, aten.minimum.default: kind.DEFAULT}

    def value(arg):
        if not isinstance(arg, torch.fx.Node):
            return arg
        if arg.op == "get_attr":
            return operator.attrgetter(arg.target)(graph_module)
        return arg.meta.get("val")

    for node in graph_module.graph.nodes:
        promotion = promotions.get(node.target) if node.op == "call_function" else None
        if promotion is None or len(node.args) <= 1:
            continue
        if node.target == aten.div.Tensor_mode and node.kwargs.get("rounding_mode") is None:
            promotion = kind.INT_TO_FLOAT
        values = [value(arg) for arg in node.args]
        if not all(isinstance(v, (torch.Tensor, bool, int, float)) for v in values):
            return True
        try:
            dtype = elementwise_dtypes(*values, type_promotion_kind=promotion)[1]
        except Exception:  # noqa: BLE001 - the pass would fail or cast: run it
            return True
        for i, schema in enumerate(node.target._schema.arguments):  # the arguments its `map_args` visits
            if schema.name in node.kwargs:
                arg = node.kwargs[schema.name]
            elif not schema.kwarg_only and i < len(node.args):
                arg = node.args[i]
            else:
                continue
            if not isinstance(schema.type, torch.TensorType):
                continue
            v = value(arg)
            if isinstance(arg, torch.fx.Node) and not isinstance(v, torch.Tensor):
                if v is None:
                    return True
                continue  # a non-tensor node value is passed on as it is
            if not isinstance(v, torch.Tensor) or v.dtype != dtype:
                return True
    return False


def _operator_kinds():
    """The call targets an ExportPass re-traces node by node through `call_operator` (ATen and
    edge-dialect operators) or keeps as they are (`getitem`, a call into a delegate's own program)."""
    import operator

    import torch
    from executorch.exir.delegate import executorch_call_delegate
    from executorch.exir.dialects.edge._ops import EdgeOpOverload

    return (torch._ops.OpOverload, EdgeOpOverload), (operator.getitem, executorch_call_delegate)


def rewrites_nothing_here(pass_, graph_module) -> bool:
    """Whether `pass_` is one of `_single_kind_rewrites` (or ExecuTorch's constant folding, or its
    removal of mixed-dtype arithmetic) and `graph_module` holds no node it would rewrite: running
    it would re-trace every node to write the same graph. Only a flat graph of operators qualifies
    (no submodule, no higher-order operator whose body this does not look into)."""
    import torch
    from executorch.exir.passes.const_prop_pass import ConstPropPass
    from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators

    whole_graph = {ConstPropPass: _folds_a_constant, RemoveMixedTypeOperators: _casts_an_argument}
    single_kind = _single_kind_rewrites().get(type(pass_))
    rewrites_graph = whole_graph.get(type(pass_)) or (
        single_kind and (lambda _pass, graph: any(single_kind(node) for node in graph.graph.nodes)))
    if rewrites_graph is None:
        return False
    if any(isinstance(m, torch.fx.GraphModule) for m in graph_module.children()):
        return False
    operators, kept = _operator_kinds()
    if any(node.op == "call_function" and not (isinstance(node.target, operators) or node.target in kept)
           for node in graph_module.graph.nodes):
        return False
    return not rewrites_graph(pass_, graph_module)


DECOMPOSED = "edgex_decomposed"


def settled(graph_module) -> bool:
    """No node that any decomposition would rewrite whatever its table: none writes to a tensor in
    place (what `run_decompositions` functionalizes), none is a composite op torch cannot preserve
    (it decomposes those, `aten.reshape` among them, with any table), none is a higher-order op
    (control flow, whose bodies this does not look into)."""
    import torch
    from torch._export.utils import _is_cia_op, _is_preservable_cia_op

    def rewritten(target) -> bool:
        if isinstance(target, torch._ops.HigherOrderOperator):
            return True
        return isinstance(target, torch._ops.OpOverload) and (
            target._schema.is_mutable or _is_cia_op(target) and not _is_preservable_cia_op(target))

    return not any(n.op == "call_function" and rewritten(n.target) for n in graph_module.graph.nodes)


def retraced_input_order(program) -> list | None:
    """The program's input specs in the order a decomposition's re-trace gives them, or None where
    this cannot tell (an input of another kind than a parameter, a buffer, a tensor constant or a
    user input, or a user input before a lifted one).

    `ExportedProgram.run_decompositions` re-traces the program's module with its states unlifted:
    torch assigns the buffers, then the parameters, then the constants to a module tree (each
    submodule created by the first of them to live in it), registers each constant as a buffer of
    its module after that module's own buffers, and lifts the buffers and constants again as
    `named_buffers()` lists them: module by module, depth first, each module's children in the
    order they were created. The parameters keep their order. A program whose states are in another
    order (ExecuTorch's constant propagation inserts the constants it folds just before the user
    inputs, after every buffer of every submodule) comes out of the re-trace reordered. Checked
    against the re-trace on each exported graph of the tiny qwen3-tts (talker prefill and decode,
    code predictor and its step, code2wav, code2latent, latent2wav; fp32 and fp16)."""
    from torch.export.graph_signature import InputKind

    specs = list(program.graph_signature.input_specs)
    rank = {InputKind.BUFFER: 0, InputKind.PARAMETER: 1, InputKind.CONSTANT_TENSOR: 2}
    lifted = sum(spec.kind in rank for spec in specs)
    if any(spec.kind not in rank for spec in specs[:lifted]) or any(spec.kind != InputKind.USER_INPUT for spec in specs[lifted:]):
        return None
    created: dict[str, int] = {}

    def module_key(target: str) -> tuple[int, ...]:
        parts = target.split(".")[:-1]
        return tuple(created.setdefault(".".join(parts[:depth]), len(created)) for depth in range(len(parts) + 1))

    keys = {i: module_key(specs[i].target) for i in sorted(range(lifted), key=lambda i: rank[specs[i].kind])}
    parameters = [i for i in range(lifted) if specs[i].kind == InputKind.PARAMETER]
    states = sorted((i for i in range(lifted) if specs[i].kind != InputKind.PARAMETER),
                    key=lambda i: (keys[i], specs[i].kind == InputKind.CONSTANT_TENSOR, i))
    return [specs[i] for i in parameters + states] + specs[lifted:]


def put_inputs_in_retraced_order(program) -> bool:
    """The program's placeholders and input specs put in `retraced_input_order`, in place; False
    (nothing changed) where that order cannot be told."""
    order = retraced_input_order(program)
    if order is None:
        return False
    graph = program.graph_module.graph
    placeholders = {node.name: node for node in graph.nodes if node.op == "placeholder"}
    if sorted(placeholders) != sorted(spec.arg.name for spec in order):
        return False
    first = next(node for node in graph.nodes if node.op != "placeholder")
    for spec in order:
        first.prepend(placeholders[spec.arg.name])
    program.graph_signature.input_specs = order
    program.graph_module.recompile()
    return True
