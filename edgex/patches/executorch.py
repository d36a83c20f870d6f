"""ExecuTorch (and the torch.fx pass machinery its passes run on): patches of its lowering.

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

import copy

from .registry import READ, SPEED_UP, register
from .executorch_graphs import (CHECKED, DECOMPOSED, edits_before_retrace, graph_fingerprint, put_inputs_in_retraced_order,
                                rewrites_nothing_here, same, settled)

_CHECKED_ON = {"executorch": "1.5.1", "torch": "2.13.0"}


@register("executorch.skip_passes_with_nothing_to_rewrite", kind=SPEED_UP, checked=_CHECKED_ON,
          symbols=("torch.fx.passes.infra.pass_base.PassBase.__call__",
                   "executorch.exir.passes.legalize_portable_dim_order_pass.LegalizePortableDimOrderPass._target_ops"),
          saves="the edge-to-ExecuTorch step's single-kind passes (transpose, view copies, symbolic scalars, "
                "dim-order copies, constant folding, mixed-dtype casts) over graphs with nothing of their kind: "
                "each a full fake-tensor re-trace (about 3 s each for the 0.6b talker prefill graph)",
          no_op="a graph holding a node the pass rewrites, a submodule or a higher-order op: the pass runs",
          upstream="each such pass could test for its node kinds before re-tracing, as ExecuTorch's "
                   "`contains_any_call_fn_target_op` does for decompositions")
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


@register("executorch.retrace_changed_graphs_only", kind=SPEED_UP, checked=_CHECKED_ON,
          symbols=("torch.fx.passes.infra.pass_base.PassBase.__call__", "executorch.exir.pass_base._ExportPassBase.call",
                   "executorch.exir.pass_manager.ExportedProgramPassManager.check"),
          saves="the re-trace of each graph a pass left unchanged and the re-validation of unchanged graphs: "
                "about a third of the 0.6b talker's XNNPACK lowering",
          no_op="a pass that changed the graph re-traces; a pass that rewrites while it re-traces always does",
          upstream="`ExportPass.call` could skip `super().call` when the pass reports no modification "
                   "(`PassResult.modified`), and the pass manager its checks of an unchanged graph")
def retrace_changed_graphs_only():
    """See the module docstring (with `skip_passes_with_nothing_to_rewrite`). The passes, their
    order and what they change are ExecuTorch's. A pass that changed only a constant's value or a
    node's metadata, no node's operation, target or arguments, is taken as unchanged and not
    re-traced; `tests/test_patches.py` (the same bytes with the patches off, on a real graph) and
    `tests/test_export_cost.py` are what would see a pass that does so."""
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
        if given is not None and given[0] is graph_module and same(given[1], graph_fingerprint(graph_module)):
            return PassResult(graph_module, False)
        return retrace(self, graph_module)

    def check_if_changed(self, exported_program):
        graph = exported_program.graph_module
        state = (graph_fingerprint(graph), str(exported_program.graph_signature))
        checked = graph.meta.get(CHECKED)
        if checked is not None and same(checked, state):
            return
        check(self, exported_program)
        graph.meta[CHECKED] = state

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


@register("executorch.decompose_only_what_is_left", kind=SPEED_UP, checked=_CHECKED_ON,
          symbols=("torch.export.ExportedProgram.run_decompositions", "torch._export.utils._is_cia_op",
                   "torch._export.utils._is_preservable_cia_op"),
          saves="ExecuTorch's three decompositions of an already decomposed float program, each a full "
                "fake-tensor re-trace of every node",
          no_op="a program never decomposed, or holding an in-place or non-preservable composite op, or an "
                "op the table decomposes: the decomposition runs",
          upstream="`to_edge_transform_and_lower` could skip each decomposition when nothing is left for it, "
                   "as it does for the second one (`contains_any_call_fn_target_op`)")
def decompose_only_what_is_left():
    """`ExportedProgram.run_decompositions` with an explicit table, skipped where it would change
    nothing: the graph already came out of a decomposition, no node added since is one that any
    decomposition rewrites (`settled`), and no node calls an operator the table decomposes.

    ExecuTorch's `to_edge_transform_and_lower` decomposes each program three times for a
    partitioner that preserves ops (`{}` to functionalize, then the default table less the
    partitioner's ops, then the default table once those are renamed): each is a full re-trace of
    every node on fake tensors. A float `.pte` is decomposed once before, by the exporter, with that
    same table (`lowering_decompositions`), which leaves the three nothing to do.
    ExecuTorch itself skips the second one when none of its targets occur, for partitioners that
    need no renaming (`contains_any_call_fn_target_op`); this extends that test to all three, with
    the `settled` check standing for what the first one does whatever its table.

    A decomposition also puts the program's inputs in the order its re-trace lifts them
    (`executorch_graphs.retraced_input_order`): the constants ExecuTorch's constant propagation
    folded, which it puts after every buffer, move up to their module's place. In an fp16 `.pte`
    some of those constants stay outside the delegates, in the program's own constant data, whose
    order follows the inputs': a skip puts the inputs in that order too (in place), and where it
    cannot tell the order, the decomposition runs."""
    from executorch.exir.graph_module import contains_any_call_fn_target_op
    from torch.export import ExportedProgram

    decompose = ExportedProgram.run_decompositions

    def only_what_is_left(self, decomp_table=None, *args, **kwargs):
        graph = self.graph_module
        if decomp_table is not None and graph.meta.get(DECOMPOSED) and settled(graph) \
                and not contains_any_call_fn_target_op(graph, decomp_table) and put_inputs_in_retraced_order(self):
            return self
        program = decompose(self, decomp_table, *args, **kwargs)
        program.graph_module.meta[DECOMPOSED] = True
        return program

    ExportedProgram.run_decompositions = only_what_is_left
    try:
        yield
    finally:
        ExportedProgram.run_decompositions = decompose


@register("executorch.partitions_share_weights", kind=SPEED_UP, checked=_CHECKED_ON,
          symbols=("executorch.backends.xnnpack.xnnpack_preprocess.XnnpackBackend.copy_exported_program_for_preprocess",
                   "executorch.exir._serialize._named_data_store.NamedDataStore.add_named_data",
                   "executorch.exir.backend.canonical_partitioners.duplicate_constant_node_pass.copy"),
          saves="the lowering's copies of the weights: a 100M-parameter stack +803 MB over the module before, "
                "+419 MB after; a 17 MB stack read by 8 partitions +271 MB before",
          no_op="a program of one partition reading weights no other partition reads copies nothing anyway",
          upstream="`copy_exported_program_for_preprocess` could share the state dict with the copy, "
                   "`duplicate_constant_node` alias the duplicates, and the named data store keep one blob per key")
def partitions_share_weights():
    """XNNPACK lowering that holds each weight once, however many partitions read it.

    ExecuTorch copies weights three ways while it lowers; inside this context all three share:
    1. A constant that several partitions read is deep-copied once per further partition
       (`duplicate_constant_node`, run by `to_backend`); the copies now alias the original's storage.
       Graphs whose partitions share weights, such as the unrolled 15-step code predictor frame,
       which sampling splits once per step, held one copy of those weights per partition.
    2. Before it preprocesses a partition, ExecuTorch deep-copies the partition's program, state
       dict included (`BackendDetails.copy_exported_program_for_preprocess`, "in case backends
       change graph inside preprocess"); the copy now takes the graph and shares the tensors. A
       100M-parameter stack: +803 MB over the module during lowering before, +419 MB after.
    3. Each partition serializes every weight it reads into its own named data store as a new
       `bytes` object; the stores are merged and deduplicated only when the program is emitted.
       XNNPACK names each blob by the SHA-256 of its bytes (`node_visitor.get_serialized_buffer_index`),
       so blobs of the same name and length are the same bytes: every partition now keeps the first.
    A 4-layer stack of 17 MB read by 8 partitions (an argmax between them): lowering +271 MB before.
    XNNPACK's passes put new constants beside the old ones rather than write into them, which
    `tests/test_export_cost.py::test_xnnpack_lowering_shares_the_weights_and_leaves_them_untouched`
    checks.
    """
    import types

    import torch
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.exir.backend.canonical_partitioners import duplicate_constant_node_pass as duplicating

    def copy_sharing_tensors(cls, program, compile_specs):
        held = (*program.state_dict.values(), *program.constants.values())
        return copy.deepcopy(program, {id(t): t for t in held if isinstance(t, torch.Tensor)})

    def aliasing_copy(value, memo=None):
        if isinstance(value, torch.nn.Parameter):
            return torch.nn.Parameter(value.detach(), requires_grad=value.requires_grad)
        if isinstance(value, torch.Tensor):
            return value.detach()
        return copy.deepcopy(value, memo)

    blobs: dict[tuple[str, int], bytes] = {}
    add_named_data = NamedDataStore.add_named_data

    def add_shared(self, key, data, *args, **kwargs):
        if isinstance(data, bytes):
            data = blobs.setdefault((key, len(data)), data)
        return add_named_data(self, key, data, *args, **kwargs)

    own = XnnpackBackend.__dict__.get("copy_exported_program_for_preprocess")
    XnnpackBackend.copy_exported_program_for_preprocess = classmethod(copy_sharing_tensors)
    NamedDataStore.add_named_data = add_shared
    duplicating.copy = types.SimpleNamespace(deepcopy=aliasing_copy)
    try:
        yield
    finally:
        duplicating.copy = copy
        NamedDataStore.add_named_data = add_named_data
        if own is None:
            del XnnpackBackend.copy_exported_program_for_preprocess
        else:
            XnnpackBackend.copy_exported_program_for_preprocess = own


_UNCHECKED_IR: list = []  # the compile config the lowering gets inside `no_ir_validity_checks`


@register("executorch.no_ir_validity_checks", kind=SPEED_UP, checked={"executorch": "1.5.1"},
          symbols=("executorch.exir.EdgeCompileConfig._check_ir_validity",),
          saves="the edge-dialect verifier's re-check of every op's dtypes after each pass: the unrolled "
                "predictor frame's lowering 251 -> 171 s",
          no_op="never: the verifier checks, it does not change the program",
          upstream="a public switch for the verifier, as for the other EdgeCompileConfig fields")
def no_ir_validity_checks():
    """Within this context `edge_compile_config()` turns the edge-dialect IR verifier off: it
    re-checks every op's dtypes after each pass, which parity, running the artifact, checks anyway."""
    _UNCHECKED_IR.append(True)
    try:
        yield
    finally:
        _UNCHECKED_IR.pop()


def edge_compile_config():
    """ExecuTorch's `EdgeCompileConfig`: its defaults, the verifier off inside `no_ir_validity_checks`."""
    from executorch.exir import EdgeCompileConfig

    return EdgeCompileConfig(_check_ir_validity=False) if _UNCHECKED_IR else EdgeCompileConfig()


@register("executorch.lowering_decompositions", kind=READ, checked=_CHECKED_ON,
          symbols=("executorch.exir.program._program._default_decomposition_table",
                   "executorch.exir.program._program._remove_invalid_ops_for_not_decompose"),
          saves="the table ExecuTorch's XNNPACK lowering decomposes with, so that the exporter decomposes a float "
                "program once with it (and `decompose_only_what_is_left` skips the lowering's three)",
          no_op="never off: the program the constant folding sees, and so the file, is built with this table",
          upstream="a public function giving the table `to_edge_transform_and_lower` uses for a partitioner")
def lowering_decompositions(extra: dict) -> dict:
    """The table ExecuTorch's lowering decomposes with for XNNPACK (its default table less the ops
    the partitioner takes whole), with `extra` (op -> decomposition) on top."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir.program._program import _default_decomposition_table, _remove_invalid_ops_for_not_decompose

    kept, _ = XnnpackPartitioner().ops_to_not_decompose(None)  # the list is the partitioner's, whatever the program
    table = _default_decomposition_table()
    for op in _remove_invalid_ops_for_not_decompose(kept):
        table.pop(op, None)
    for op, decomposition in extra.items():  # item by item: the table is torch's lazy one
        table[op] = decomposition
    return table


@register("executorch.program_file", kind=READ, checked={"executorch": "1.5.1"},
          symbols=("executorch.exir._serialize._program._get_extended_header",
                   "executorch.exir._serialize._flatbuffer_program._flatbuffer_to_program",
                   "executorch.exir._serialize._flatbuffer._flatc_decompile"),
          saves="a `.pte`'s program, its data segments' places and an XNNPACK delegate's graph read back from the "
                "file, for the check of the quantized weights a delegate holds (`exporters.xnnpack_weights`)",
          no_op="never off: nothing is written with it; the stored weights are read with it",
          upstream="a public reader of a `.pte` (program and segments), and of a delegate's flatbuffer with its schema")
def program_file(data) -> tuple:
    """A `.pte`'s extended header (None for a file without one) and its program
    (`executorch.exir.schema.Program`), from `data`, the file's bytes (a memory map will do: only
    the program's part is copied)."""
    from executorch.exir._serialize._flatbuffer_program import _flatbuffer_to_program
    from executorch.exir._serialize._program import _get_extended_header

    header = _get_extended_header(bytes(data[:64]))
    return header, _flatbuffer_to_program(bytes(data[: header.program_size if header else len(data)]))


def flatc_decompile(folder: str, schema: str, binary: str) -> None:
    """`flatc` as ExecuTorch ships it: `binary` (a flatbuffer of `schema`) written as JSON into
    `folder` (part of `executorch.program_file`)."""
    from executorch.exir._serialize._flatbuffer import _flatc_decompile

    _flatc_decompile(folder, schema, binary)


@register("executorch.runtime_threads", kind=READ, checked={"executorch": "1.5.1"},
          symbols=("executorch.extension.pybindings.portable_lib._threadpool_get_thread_count",
                   "executorch.extension.pybindings.portable_lib._unsafe_reset_threadpool"),
          saves="the pybindings runtime's thread pool sized as the run asks (`--threads`), for timings and "
                "results that do not depend on the host's core count",
          no_op="a pool already of that size is left as it is",
          upstream="`executorch.runtime.Runtime` taking a thread count")
def runtime_threads(threads: int) -> None:
    """ExecuTorch's pybindings thread pool resized to `threads` (it is process-wide) where it is not
    already that size."""
    from executorch.extension.pybindings import portable_lib

    if portable_lib._threadpool_get_thread_count() != threads:
        portable_lib._unsafe_reset_threadpool(threads)
