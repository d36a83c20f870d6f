"""ExecuTorch's graph passes without the re-traces of graphs they left unchanged.

ExecuTorch runs a dozen passes over each program on its way to the edge dialect, and its XNNPACK
backend 17 more over each partition before it serializes it (`XNNPACKPassManager`). Most of
them edit the graph in place and then re-trace the whole graph
(`super().call(graph_module)`: every node run again on fake tensors) to regenerate its metadata,
whether or not they found anything to edit. A transformer has nothing for most of them (batch
norms, 1-d convolutions, PReLU, upsampling): each re-trace of a 28-layer talker then costs about as
much as one that changes it, a third of the whole `.pte` lowering. Inside `retrace_changed_graphs_only`,
such a pass's re-trace is skipped when the graph it is about to re-trace is the one it was given,
node for node (operation, target, arguments): its metadata is still that of the previous trace.

Passes whose work is the re-trace itself (those that override the interpreter's hooks, such as
`call_operator`) re-trace, unless the graph holds nothing of the few kinds of node such a pass
rewrites (`rewrites_nothing_here`; `skip_passes_with_nothing_to_rewrite` applies just that, and is
what the edge-to-ExecuTorch step runs under). The validation ExecuTorch's pass manager runs before
and after each pass (recompiling the graph's Python code, linting it, checking its signature) is
skipped for a graph and signature unchanged since it last passed.

`decompose_only_what_is_left` does the same for whole decompositions: `run_decompositions` is a
re-trace too, skipped where nothing is left for it to decompose.

This module is light: torch and executorch are imported inside.
"""

from __future__ import annotations

from contextlib import contextmanager

# ExportPass methods through which a pass rewrites nodes while it re-traces: a pass that overrides
# any of them changes the graph in the re-trace itself, which must therefore always run.
_TRACE_HOOKS = ("call_operator", "call_getitem", "call_sym", "call_cond", "call_map", "call_scan", "call_while",
                "call_submodule", "placeholder", "output", "on_attr", "inputs", "call_size_operator")


_CHECKED = "edgex_checked"  # graph meta: the state of the graph when a pass manager last validated it


def graph_fingerprint(graph_module) -> list:
    """Each node's operation, name, target and arguments (other nodes by name): equal for two
    states of a graph exactly when no node was added, removed, re-targeted or re-wired."""
    from torch.fx import Node
    from torch.fx.node import map_aggregate

    def named(value):
        return ("node", value.name) if isinstance(value, Node) else value

    return [(n.op, n.name, n.target, map_aggregate(n.args, named), map_aggregate(n.kwargs, named)) for n in graph_module.graph.nodes]


def _same(a: list, b: list) -> bool:
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


@contextmanager
def skip_passes_with_nothing_to_rewrite():
    """Every pass for which `rewrites_nothing_here` holds returns the graph it was given, unchanged,
    without running."""
    from executorch.exir.pass_base import PassResult
    from torch.fx.passes.infra.pass_base import PassBase

    run = PassBase.__call__

    def unless_nothing_to_rewrite(self, graph_module):
        if rewrites_nothing_here(self, graph_module):
            return PassResult(graph_module, False)
        return run(self, graph_module)

    PassBase.__call__ = unless_nothing_to_rewrite
    try:
        yield
    finally:
        PassBase.__call__ = run


@contextmanager
def retrace_changed_graphs_only():
    """See the module docstring (with `skip_passes_with_nothing_to_rewrite`). The passes, their
    order and what they change are ExecuTorch's."""
    from executorch.exir import pass_base
    from executorch.exir.pass_base import PassResult
    from executorch.exir.pass_manager import ExportedProgramPassManager
    from torch.fx.passes.infra.pass_base import PassBase

    retrace = pass_base._ExportPassBase.call

    def noting_the_graph(self, graph_module):
        if isinstance(self, pass_base._ExportPassBase) and edits_before_retrace(type(self)):
            self._edgex_given = (graph_module, graph_fingerprint(graph_module))
        try:
            return run(self, graph_module)
        finally:
            self.__dict__.pop("_edgex_given", None)

    def retrace_if_changed(self, graph_module):
        given = self.__dict__.get("_edgex_given")
        if given is not None and given[0] is graph_module and _same(given[1], graph_fingerprint(graph_module)):
            return PassResult(graph_module, False)
        return retrace(self, graph_module)

    def check_if_changed(self, exported_program):
        graph = exported_program.graph_module
        state = (graph_fingerprint(graph), str(exported_program.graph_signature))
        checked = graph.meta.get(_CHECKED)
        if checked is not None and _same(checked, state):
            return
        check(self, exported_program)
        graph.meta[_CHECKED] = state

    check = ExportedProgramPassManager.check
    with skip_passes_with_nothing_to_rewrite():
        run = PassBase.__call__
        PassBase.__call__ = noting_the_graph
        pass_base._ExportPassBase.call = retrace_if_changed
        ExportedProgramPassManager.check = check_if_changed
        try:
            yield
        finally:
            ExportedProgramPassManager.check = check
            pass_base._ExportPassBase.call = retrace
            PassBase.__call__ = run


_DECOMPOSED = "edgex_decomposed"


def _settled(graph_module) -> bool:
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


@contextmanager
def decompose_only_what_is_left():
    """`ExportedProgram.run_decompositions` with an explicit table, skipped where it would change
    nothing: the graph already came out of a decomposition, no node added since is one that any
    decomposition rewrites (`_settled`), and no node calls an operator the table decomposes.

    ExecuTorch's `to_edge_transform_and_lower` decomposes each program three times for a
    partitioner that preserves ops (`{}` to functionalize, then the default table less the
    partitioner's ops, then the default table once those are renamed): each is a full re-trace of
    every node on fake tensors. A float `.pte` is decomposed once before, by the exporter, with that
    same table (`executorch._lowering_decompositions`), which leaves the three nothing to do.
    ExecuTorch itself skips the second one when none of its targets occur, for partitioners that
    need no renaming (`contains_any_call_fn_target_op`); this extends that test to all three, with
    the `_settled` check standing for what the first one does whatever its table."""
    from executorch.exir.graph_module import contains_any_call_fn_target_op
    from torch.export import ExportedProgram

    decompose = ExportedProgram.run_decompositions

    def only_what_is_left(self, decomp_table=None, *args, **kwargs):
        graph = self.graph_module
        if decomp_table is not None and graph.meta.get(_DECOMPOSED) and _settled(graph) \
                and not contains_any_call_fn_target_op(graph, decomp_table):
            return self
        program = decompose(self, decomp_table, *args, **kwargs)
        program.graph_module.meta[_DECOMPOSED] = True
        return program

    ExportedProgram.run_decompositions = only_what_is_left
    try:
        yield
    finally:
        ExportedProgram.run_decompositions = decompose
