"""What keeps a full-size export inside one machine: the reference's outputs
on the example are not recomputed for parity, and the table read-back decodes only constants that
can be a table, from the file itself rather than from copies of it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgex.component import Component, TensorSpec


def test_the_reference_outputs_the_recipe_computed_are_what_parity_reads():
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    (comp,) = recipe.components(recipe.load("tiny", None, 0), ["talker_prefill"])  # prefill only: no eager frames
    first = next(iter(comp.samples))
    calls = []
    reference = comp.reference
    comp.reference = lambda *x: calls.append(1) or reference(*x)
    try:
        kept = comp.reference_outputs(first)
    finally:
        comp.reference = reference
    assert not calls  # kept from the recipe's own run, not recomputed
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(kept, reference(*comp.samples[first])))


class _Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Embedding(300, 32)
        self.proj = nn.Linear(32, 32)
        self.register_buffer("offset", torch.randn(5, 7))  # a constant no table can be

    def forward(self, ids):
        return (self.proj(self.table(ids)) + self.offset.sum(),)


def test_table_read_back_decodes_only_table_shaped_constants_from_the_file(tmp_path):
    """ONNX (external data) and .pte (constant segment, read through a memory map): the table comes
    back exact and row-scored, and constants no table can be are not decoded at all."""
    from edgex.exporters import EXPORTERS
    from edgex.parity.tensors import tensor_parity

    module = _Lookup().eval()
    ids = torch.tensor([[3, 7, 299]])
    comp = Component("lookup", "test", module, [TensorSpec("ids", (1, 3), "int64")], [TensorSpec("y", (1, 3, 32), "float32")],
                     lambda x: module(x), {"s": (ids,)}, tables={"table": module.table.weight})
    for name in ("onnx", "executorch"):
        exporter = EXPORTERS.get(name)
        files = exporter.export(comp, "fp32", tmp_path / f"lookup{exporter.extension}").files
        constants = exporter.stored_constants(comp, files, "fp32")
        assert {a.shape for a in constants.values()} == {(300, 32)}, (name, {k: a.shape for k, a in constants.items()})
        block = tensor_parity(exporter, comp, files, 60.0, "fp32")
        assert block["verdict"] == "pass" and block["tensors"]["table"]["snr_db"] == float("inf"), (name, block)


def test_fp16_casts_and_rounds_only_the_parameters_read():
    """A talker graph's wrapper holds the whole talker (its text embedding: 311M parameters at
    0.6b, read by no talker graph): the fp16 export leaves it alone, the fp16 scheme reference does
    not round it, and a step graph's reference rounds the head of every sample's step."""
    from edgex.exporters.base import module_in
    from edgex.parity.scheme import rounded_to_fp16
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    prefill, step = recipe.components(recipe.load("tiny", None, 0), ["talker_prefill", "code_predictor_step"])
    text, up = prefill.module.model.text_embedding.weight, prefill.module.model.layers[0].mlp.up_proj.weight
    rounded = set(rounded_to_fp16(prefill).weights)
    assert "model.text_embedding.weight" not in rounded and {"model.layers.0.mlp.up_proj.weight", "codec_head.weight"} <= rounded
    with module_in(prefill, torch.float16):
        assert (text.dtype, up.dtype) == (torch.float32, torch.float16)
        kept = {name for name, b in prefill.module.named_buffers() if b.dtype == torch.float32}
        assert kept == set()  # every float buffer is cast, the RoPE cos / sin table too (register_rope)
    assert up.dtype == torch.float32

    steps = [int(s[2]) for s in step.samples.values()]  # heads read: step - 1 (step 0 reads head 0)
    heads = {f"heads.{max(s - 1, 0)}.weight" for s in steps}
    rounded = {n for n in rounded_to_fp16(step).weights if n.startswith("heads.")}
    assert rounded == heads and len(heads) >= 3, (rounded, steps)


def test_a_forked_job_returns_its_result_and_its_memory_ends_with_it():
    """`edgex.isolation.run_forked`: the child holds what it allocates, the parent never does."""
    import psutil

    from edgex.isolation import run_forked

    before = psutil.Process().memory_info().rss

    def allocate():
        start = psutil.Process().memory_info().rss
        block = torch.ones(64 * 2**20)  # 256 MB
        return psutil.Process().memory_info().rss - start, float(block.sum())

    grown, total = run_forked(allocate)
    assert total == 64 * 2**20 and grown > 200 * 2**20  # the child held the block
    assert psutil.Process().memory_info().rss - before < 100 * 2**20  # and took it with it


def test_a_forked_job_raises_its_error_here_and_a_killed_one_says_how_it_died():
    import os
    import signal

    import pytest

    from edgex.errors import EdgexError
    from edgex.isolation import ChildDied, run_forked

    def bad_input():
        raise EdgexError("no such thing")

    with pytest.raises(EdgexError, match="no such thing"):
        run_forked(bad_input)
    with pytest.raises(ChildDied, match="SIGKILL.*out of memory"):
        run_forked(lambda: os.kill(os.getpid(), signal.SIGKILL))


def test_an_export_job_killed_for_memory_is_an_error_and_the_export_goes_on(tmp_path, monkeypatch):
    """The OOM killer's SIGKILL in one job (here sent by a sabotaged exporter) costs that artifact,
    recorded as an error, not the export: the next job still runs and passes. Killed beside another
    job, it was run once more alone first."""
    import os
    import signal

    from edgex.export import export_model
    from edgex.exporters.executorch import ExecuTorchExporter

    tries = tmp_path / "tries"

    def killed(*_a, **_k):
        with open(tries, "a") as f:
            f.write("x")
        os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(ExecuTorchExporter, "export", killed)
    manifest = export_model("qwen3-tts", "cpu", tmp_path / "out", preset="tiny", components=["talker_prefill"],
                            precisions=["fp32"], jobs=2)
    by_exporter = {a["exporter"]: a for a in manifest["artifacts"]}
    assert by_exporter["executorch"]["verdict"] == "error" and "SIGKILL" in by_exporter["executorch"]["error"]
    assert by_exporter["executorch"]["killed_by"] == "SIGKILL" and tries.read_text() == "xx"
    assert by_exporter["onnx"]["verdict"] == "pass"
    assert manifest["status"] == "fail"
    assert not list((tmp_path / "out" / "qwen3-tts" / "cpu").rglob("*.pte"))


def test_what_a_forked_job_computed_for_its_component_comes_back(tmp_path):
    """Eager reference outputs the job computed (every parity sample) are kept for the next job of
    the component, not computed again in each child."""
    from edgex.export import _start_isolated
    from edgex.plan import Job
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    (comp,) = recipe.components(recipe.load("tiny", None, 0), ["talker_prefill"])
    assert set(comp._reference_outputs) == {next(iter(comp.samples))}
    (entry,) = _start_isolated(Job("talker_prefill", "talker", "onnx", "fp16"), comp, tmp_path, None, None, None).result()
    assert entry["verdict"] == "pass"
    assert set(comp._reference_outputs) == set(comp.samples)
    assert set(comp._reads) == {"module", "reference"}  # fp16: what the cast and the scheme reference read


def test_xnnpack_lowering_shares_the_weights_and_leaves_them_untouched(tmp_path, monkeypatch):
    """The partition XNNPACK preprocesses reads the module's own weight tensors (ExecuTorch alone
    deep-copies them first: a second copy of every weight at the lowering's peak), preprocessing
    leaves them unchanged, and the `.pte` still computes the module."""
    from executorch.backends.xnnpack.xnnpack_preprocess import XnnpackBackend
    from executorch.runtime import Runtime

    from edgex.exporters import EXPORTERS

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32), nn.LayerNorm(32)).eval()
    x = torch.randn(1, 32)
    comp = Component("mlp", "test", module, [TensorSpec("x", (1, 32), "float32")], [TensorSpec("y", (1, 32), "float32")],
                     lambda t: (module(t),), {"s": (x,)})
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    seen = set()
    preprocess = XnnpackBackend.preprocess

    def recording(program, compile_specs):
        seen.update(t.data_ptr() for t in program.state_dict.values())
        return preprocess(program, compile_specs)

    monkeypatch.setattr(XnnpackBackend, "preprocess", staticmethod(recording))
    (pte,) = EXPORTERS.get("executorch").export(comp, "fp32", tmp_path / "mlp.pte").files
    weights = {module[0].weight.data_ptr(), module[2].weight.data_ptr()}
    assert weights <= seen, "the partition program holds copies of the module's weights"
    assert all(torch.equal(p, before[name]) for name, p in module.named_parameters())
    out = Runtime.get().load_program(str(pte)).load_method("forward").execute([x])[0]
    with torch.no_grad():
        assert torch.allclose(out, module(x), atol=1e-5)


_KEPT: list = []  # what the leaking stand-in exporter below keeps alive, as torch's caches do


def _stack_component(layers: int, width: int) -> Component:
    torch.manual_seed(0)
    module = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).eval()
    x = torch.randn(1, width)
    return Component("stack", "test", module, [TensorSpec("x", (1, width), "float32")],
                     [TensorSpec("y", (1, width), "float32")], lambda t: (module(t),), {"s": (x,)})


def test_a_lowering_that_keeps_its_memory_keeps_it_only_in_its_own_process(tmp_path):
    """`export._lower_apart`: what an exporter leaves alive after writing its files (here 256 MB a
    stand-in exporter keeps, as torch's fake-tensor cache keeps a lowered `.pte`'s weight copy) stays
    in the process forked for the lowering; lowered in the job's own process, it stays there."""
    import psutil

    from edgex.exporters.base import ExportResult, Exporter
    from edgex.export import _lower, _lower_apart
    from edgex.plan import Job

    class Leaky(Exporter):
        name, format, extension, runtime = "leaky", "bin", ".bin", "onnxruntime"

        def export(self, component, precision, dest):
            _KEPT.append(torch.ones(64 * 2**20))
            dest.write_bytes(b"artifact")
            return ExportResult([dest], "float32", {"kept_mb": 256})

    comp, job, rss = _stack_component(1, 8), Job("stack", "test", "leaky", "fp32"), psutil.Process().memory_info
    before = rss().rss
    result, peak_mb, _ = _lower_apart(Leaky(), comp, job, tmp_path / "apart.bin")
    assert result.details == {"kept_mb": 256} and (tmp_path / "apart.bin").read_bytes() == b"artifact"
    assert peak_mb > 256 and rss().rss - before < 64 * 2**20 and not _KEPT
    result, peak_mb = _lower(Leaky(), comp, job, tmp_path / "here.bin")[:2]
    assert rss().rss - before > 200 * 2**20 and len(_KEPT) == 1
    _KEPT.clear()


def test_a_pte_lowered_apart_leaves_the_job_s_process_as_it_was(tmp_path):
    """The real case: a 67 MB Linear stack lowered to `.pte` in its own process; the job's
    process, which runs parity next, does not grow by the weight copy the lowering leaves alive
    (lowered here instead, it grows by it: checked when this test was written)."""
    import psutil

    from edgex.exporters import EXPORTERS
    from edgex.export import _lower_apart
    from edgex.plan import Job

    comp = _stack_component(4, 2048)
    before = psutil.Process().memory_info().rss
    result, _, _ = _lower_apart(EXPORTERS.get("executorch"), comp, Job("stack", "test", "executorch", "fp32"), tmp_path / "s.pte")
    assert psutil.Process().memory_info().rss - before < 32 * 2**20
    assert result.files == [tmp_path / "s.pte"] and result.details["delegate_subgraphs"] >= 1


class _Unrolled(nn.Module):
    """One Linear stack run three times with an argmax between the runs: XNNPACK takes no argmax,
    so each run is a partition of its own, and all three read the same weights (the code predictor
    frame's shape: 15 steps, sampling between them)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stack = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64))
        self.embed = nn.Embedding(16, 64)

    def forward(self, x):
        codes = []
        for _ in range(3):
            code = torch.argmax(self.stack(x)[..., :16], dim=-1)
            codes.append(code)
            x = self.embed(code)
        return (torch.stack(codes, -1),)


def test_partitions_that_read_the_same_weights_share_them(tmp_path, monkeypatch):
    """The constants ExecuTorch duplicates for each further partition that reads them
    (`duplicate_constant_node`: deep copies) alias the module's own weights, each weight is
    serialized into one `bytes` object that every partition's store shares, and the `.pte` still
    computes the module."""
    from executorch.exir._serialize._named_data_store import NamedDataStore
    from executorch.exir.backend import utils as backend_utils
    from executorch.runtime import Runtime

    from edgex.exporters import EXPORTERS

    module = _Unrolled().eval()
    x = torch.randn(1, 1, 64)
    comp = Component("unrolled", "test", module, [TensorSpec("x", (1, 1, 64), "float32")],
                     [TensorSpec("codes", (1, 1, 3), "int64")], lambda t: module(t), {"s": (x,)})
    duplicates, blobs = [], {}
    duplicate, add_named_data = backend_utils.duplicate_constant_node, NamedDataStore.add_named_data

    def record_duplicates(program, name):
        made = duplicate(program, name)
        duplicates.extend({**program.state_dict, **program.constants}[copy].data_ptr() for copy in made)
        return made

    def record_blob(store, key, data, *args, **kwargs):
        blobs.setdefault(key, set()).add(id(data))
        return add_named_data(store, key, data, *args, **kwargs)

    monkeypatch.setattr(backend_utils, "duplicate_constant_node", record_duplicates)
    monkeypatch.setattr(NamedDataStore, "add_named_data", record_blob)
    result = EXPORTERS.get("executorch").export(comp, "fp32", tmp_path / "u.pte")
    own = {p.data_ptr() for p in module.stack.parameters()}
    assert result.details["delegate_subgraphs"] == 3
    assert len(duplicates) == 8 and set(duplicates) == own, "partitions read copies of the module's weights"
    assert len(blobs) == 4 and all(len(ids) == 1 for ids in blobs.values()), blobs  # 2 weights, 2 biases
    out = Runtime.get().load_program(str(result.files[0])).load_method("forward").execute([x])[0]
    with torch.no_grad():
        assert torch.equal(out, module(x)[0])


def test_lowering_keeps_node_provenance_by_reference_and_writes_the_same_file(tmp_path, monkeypatch):
    """Within the exporters' torch.export and lowering, a node's new provenance record shares the
    records it came from instead of deep-copying its whole history (`provenance_by_reference`;
    19.5% of the 0.6b talker decode lowering was that deepcopy), torch's own `copy` is back after,
    and the `.pte` is byte for byte the one lowered with torch's deep copies."""
    import contextlib
    import copy

    from torch.fx import traceback as fx_traceback

    from edgex.exporters import EXPORTERS
    from edgex.exporters import executorch as et

    init = fx_traceback.NodeSource.__init__
    shared: list[bool] = []

    def recording(self, node, *args, **kwargs):
        init(self, node, *args, **kwargs)
        history = node.meta.get("from_node", []) if node is not None else []
        if history:
            shared.append(all(a is b for a, b in zip(self.from_node, history)))

    monkeypatch.setattr(fx_traceback.NodeSource, "__init__", recording)
    comp = _stack_component(3, 64)
    files = {}
    for label, context in (("by reference", et.provenance_by_reference), ("deep copies", contextlib.nullcontext)):
        monkeypatch.setattr(et, "provenance_by_reference", context)
        shared.clear()
        (pte,) = EXPORTERS.get("executorch").export(comp, "fp32", tmp_path / f"{label}.pte").files
        files[label] = pte.read_bytes()
        assert set(shared) == {label == "by reference"}, label  # every record with a history: shared, or every one copied
        assert fx_traceback.copy is copy
    assert files["by reference"] == files["deep copies"]


class _ConvAndNorm(nn.Module):
    """A 1-d convolution (which XNNPACK's passes rewrite as 2-d) and an RMS-norm, linear, residual
    block (which most of its passes leave as it is)."""

    def __init__(self, width: int = 32):
        super().__init__()
        self.conv = nn.Conv1d(width, width, 3, padding=1)
        self.norm = nn.RMSNorm(width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        h = self.conv(x).transpose(1, 2)
        return h + self.proj(torch.relu(self.norm(h)))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_xnnpack_passes_skip_only_the_retraces_of_graphs_they_left_unchanged(tmp_path, monkeypatch, precision):
    """`retrace_changed_graphs_only`: a pass that edits the graph in place re-traces it only when
    it edited something (the 1-d convolution's rewrite re-traces, the batch-norm passes over a graph
    without one do not), ExecuTorch's own re-trace is back after, and the `.pte` is byte for byte
    the one lowered with every re-trace."""
    import contextlib

    from executorch.exir import pass_base
    from executorch.exir.pass_manager import ExportedProgramPassManager

    from edgex.exporters import EXPORTERS
    from edgex.exporters import executorch as et

    torch.manual_seed(0)
    module, x = _ConvAndNorm().eval(), torch.randn(1, 32, 12)
    comp = Component("block", "test", module, [TensorSpec("x", (1, 32, 12), "float32")],
                     [TensorSpec("y", (1, 12, 32), "float32")], lambda t: (module(t),), {"s": (x,)})
    retrace = pass_base._ExportPassBase.call
    traced: list[str] = []

    def counting(self, graph_module):
        traced.append(type(self).__name__)
        return retrace(self, graph_module)

    check = ExportedProgramPassManager.check
    checked: list[int] = []

    def counting_checks(self, program):
        checked.append(1)
        return check(self, program)

    monkeypatch.setattr(pass_base._ExportPassBase, "call", counting)
    monkeypatch.setattr(ExportedProgramPassManager, "check", counting_checks)
    files, counts, checks = {}, {}, {}
    # XNNPACK lowers its attention patterns once per process, inside the first lowering: done here first
    EXPORTERS.get("executorch").export(comp, precision, tmp_path / "first.pte")
    for label, context, skip in (("changed only", et.retrace_changed_graphs_only, et.skip_passes_with_nothing_to_rewrite),
                                 ("every one", contextlib.nullcontext, contextlib.nullcontext)):
        monkeypatch.setattr(et, "retrace_changed_graphs_only", context)
        monkeypatch.setattr(et, "skip_passes_with_nothing_to_rewrite", skip)
        traced.clear()
        checked.clear()
        (pte,) = EXPORTERS.get("executorch").export(comp, precision, tmp_path / f"{label}.pte").files
        files[label], counts[label], checks[label] = pte.read_bytes(), list(traced), len(checked)
        assert pass_base._ExportPassBase.call is counting and ExportedProgramPassManager.check is counting_checks
    assert "Conv1dUnsqueezePass" in counts["changed only"]
    assert "FuseBatchNormPass" in counts["every one"] and "FuseBatchNormPass" not in counts["changed only"]
    # a static graph without view operators, constants to fold, dim-order copies or portable
    # reductions: the passes that rewrite only those do not run
    for name in ("SymToTensorPass", "ReplaceBrokenOpsWithFunctionalOpsPass", "NormalizeTransposePass", "ConstPropPass",
                 "DimOrderOpsRevertPass", "LegalizePortableDimOrderPass"):
        assert name in counts["every one"] and name not in counts["changed only"], name
    if precision == "fp32":  # fp16 arithmetic with float32 scalars is cast (and XNNPACK's attention
        # patterns, lowered inside, mix dtypes: those still run it)
        mixed = "RemoveMixedTypeOperators"
        assert counts["changed only"].count(mixed) < counts["every one"].count(mixed)
    assert checks["changed only"] < checks["every one"]  # validations of unchanged graphs skipped too
    assert files["changed only"] == files["every one"]


def _as_edge(graph_module):
    """`graph_module` with each ATen operator replaced by its edge-dialect counterpart."""
    from executorch.exir.dialects._ops import ops as exir_ops

    for node in graph_module.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            packet = getattr(getattr(exir_ops.edge, node.target.namespace), node.target._schema.name.split("::")[1])
            node.target = getattr(packet, node.target._overloadname)
    return graph_module


def test_a_single_kind_pass_is_skipped_only_where_its_kind_is_absent():
    """`rewrites_nothing_here`: each pass runs on a graph holding what it rewrites (an `aten.t`, a
    view operator, a symbolic scalar, a dim-order copy, a portable reduction, an operator reading
    no input or only graph constants) and on any graph with a submodule or a higher-order operator;
    it is skipped on a flat ATen or edge-dialect graph without it."""
    from executorch.exir.passes.const_prop_pass import ConstPropPass
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass
    from executorch.exir.passes.memory_format_ops_pass import DimOrderOpsRevertPass
    from executorch.exir.passes.normalize_transpose_pass import NormalizeTransposePass
    from executorch.exir.passes.replace_broken_ops_with_function_ops_pass import ReplaceBrokenOpsWithFunctionalOpsPass
    from executorch.exir.passes.sym_to_tensor_pass import SymToTensorPass
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from edgex.patches.executorch_graphs import rewrites_nothing_here

    x, table = torch.randn(4, 4), torch.randn(4, 4)
    plain = make_fx(lambda a: torch.mm(a, a) + 1)(x)
    transposed = make_fx(lambda a: torch.mm(a.t(), a))(x)
    viewed = make_fx(lambda a: a.view(16) * 2)(x)
    symbolic = make_fx(lambda a: a * 2)(x)
    next(iter(symbolic.graph.nodes)).meta["val"] = ShapeEnv().create_unbacked_symint()
    filled = make_fx(lambda a: a + torch.ones(4, 4))(x)
    from_constant = make_fx(lambda a: a + table.exp())(x)
    assert any(n.op == "get_attr" for n in from_constant.graph.nodes)
    cast = _as_edge(make_fx(lambda a: a.to(memory_format=torch.contiguous_format, dtype=torch.float16) * 2)(x))
    from executorch.exir.dialects._ops import ops as exir_ops
    for node in cast.graph.nodes:
        if node.op == "call_function" and node.target == exir_ops.edge.aten._to_copy.default:
            node.target = exir_ops.edge.dim_order_ops._to_dim_order_copy.default
            node.kwargs = {"dtype": torch.float16, "dim_order": [0, 1]}
    reduced = _as_edge(make_fx(lambda a: a.mean(dim=-1, keepdim=True) * a)(x))
    assert any(n.target == torch.ops.aten.t.default for n in transposed.graph.nodes)
    for pass_, holding in ((NormalizeTransposePass(), transposed), (ReplaceBrokenOpsWithFunctionalOpsPass(), viewed),
                           (SymToTensorPass(), symbolic), (ConstPropPass(), filled), (ConstPropPass(), from_constant),
                           (DimOrderOpsRevertPass(), cast), (LegalizePortableDimOrderPass(), reduced)):
        assert rewrites_nothing_here(pass_, plain), type(pass_).__name__
        assert not rewrites_nothing_here(pass_, holding), type(pass_).__name__
        nested = make_fx(lambda a: torch.mm(a, a) + 1)(x)
        nested.add_submodule("body", make_fx(lambda a: a + 1)(x))
        assert not rewrites_nothing_here(pass_, nested)
    for pass_ in (ConstPropPass(), DimOrderOpsRevertPass(), LegalizePortableDimOrderPass()):
        assert rewrites_nothing_here(pass_, _as_edge(make_fx(lambda a: torch.mm(a, a) + 1)(x))), type(pass_).__name__
    assert not rewrites_nothing_here(ConstPropPass(propogate_quant=True), plain)  # its quantized variant always runs
    assert not rewrites_nothing_here(object(), plain)  # any other pass always runs


class _Binary(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, a, b):
        return self.fn(a, b)


_MIXED = {  # name: (function, dtypes of a and b, whether RemoveMixedTypeOperators casts an argument)
    "add fp32 fp16": (lambda a, b: a + b, (torch.float32, torch.float16), True),
    "mul fp32 fp32": (lambda a, b: a * b, (torch.float32, torch.float32), False),
    "div int int": (lambda a, b: a / b, (torch.int32, torch.int32), True),
    "floor div int int": (lambda a, b: torch.div(a, b, rounding_mode="floor"), (torch.int32, torch.int32), False),
    "sub fp32 int": (lambda a, b: a - b, (torch.float32, torch.int64), True),
    "minimum fp16 fp32": (torch.minimum, (torch.float16, torch.float32), True),
    "maximum fp16 fp32": (torch.maximum, (torch.float16, torch.float32), False),  # not an operator it casts for
    "scaled fp32": (lambda a, b: a * 0.5 + b, (torch.float32, torch.float32), False),
    "scaled fp16": (lambda a, b: a * 0.5 + b, (torch.float16, torch.float16), True),  # the 0.5 is a float32 scalar
}


@pytest.mark.parametrize("case", list(_MIXED))
def test_mixed_dtype_arithmetic_is_skipped_exactly_where_the_pass_would_cast_nothing(case):
    """`rewrites_nothing_here` for `RemoveMixedTypeOperators`, on the ATen graph it gets in the
    lowering (after `ScalarToTensorPass`): it says the graph holds nothing to cast exactly when
    running the pass inserts no cast."""
    from executorch.exir.passes.remove_mixed_type_operators import RemoveMixedTypeOperators
    from executorch.exir.passes.scalar_to_tensor_pass import ScalarToTensorPass

    from edgex.patches.executorch_graphs import rewrites_nothing_here

    fn, dtypes, casts = _MIXED[case]
    inputs = tuple((torch.rand(2, 3) * 4 + 1).to(d) for d in dtypes)
    graph = ScalarToTensorPass()(torch.export.export(_Binary(fn), inputs).graph_module).graph_module

    def copies(module):
        return sum(1 for n in module.graph.nodes if n.target == torch.ops.aten._to_copy.default)

    inserted = copies(RemoveMixedTypeOperators()(graph).graph_module) - copies(graph)
    assert (inserted > 0) == casts
    assert rewrites_nothing_here(RemoveMixedTypeOperators(), graph) == (not casts)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "8da8w"])
def test_lowering_skips_only_the_decompositions_that_would_change_nothing(tmp_path, monkeypatch, precision):
    """`decompose_only_what_is_left`: of the program's decompositions, those with nothing left to
    decompose in a program that already came out of one are skipped (the float lowering's own
    decomposition runs, and a quantized program's first one, which functionalizes it); the
    `.pte` is byte for byte the one lowered with every decomposition, and torch's own method is
    back after."""
    import contextlib

    from torch.export import ExportedProgram

    from edgex.exporters import EXPORTERS
    from edgex.exporters import executorch as et

    torch.manual_seed(0)
    module, x = _ConvAndNorm().eval(), torch.randn(1, 32, 12)
    comp = Component("block", "test", module, [TensorSpec("x", (1, 32, 12), "float32")],
                     [TensorSpec("y", (1, 12, 32), "float32")], lambda t: (module(t),), {"s": (x,)})
    EXPORTERS.get("executorch").warm_up()  # XNNPACK's pattern graphs, built once per process, decomposed too
    decompose = ExportedProgram.run_decompositions
    tables: list = []

    def counting(self, decomp_table=None, *args, **kwargs):
        tables.append(None if decomp_table is None else len(decomp_table))
        return decompose(self, decomp_table, *args, **kwargs)

    monkeypatch.setattr(ExportedProgram, "run_decompositions", counting)
    files, ran = {}, {}
    for label, context in (("what is left", et.decompose_only_what_is_left), ("every one", contextlib.nullcontext)):
        monkeypatch.setattr(et, "decompose_only_what_is_left", context)
        tables.clear()
        (pte,) = EXPORTERS.get("executorch").export(comp, precision, tmp_path / f"{label}.pte").files
        files[label], ran[label] = pte.read_bytes(), list(tables)
        assert ExportedProgram.run_decompositions is counting
    assert len(ran["what is left"]) < len(ran["every one"])
    # the first one always runs: the float lowering's own table, a quantized program's `{}`
    assert ran["what is left"][0] == ran["every one"][0] and (ran["every one"][0] > 100) == (precision != "8da8w")
    assert files["what is left"] == files["every one"]


def test_the_onnx_export_reads_its_opset_from_the_graph_without_serializing_the_model(tmp_path, monkeypatch):
    """`ONNXProgram.model_proto` serializes the whole model, weights included, on every access: the
    exporter records the opset the file declares without it."""
    import onnx
    from torch.onnx._internal.exporter._onnx_program import ONNXProgram

    from edgex.exporters import EXPORTERS

    def serializing(_program):
        raise AssertionError("the model was serialized to read its opset")

    monkeypatch.setattr(ONNXProgram, "model_proto", property(serializing))
    result = EXPORTERS.get("onnx").export(_stack_component(2, 16), "fp32", tmp_path / "s.onnx")
    declared = {o.domain: o.version for o in onnx.load(str(result.files[0])).opset_import}
    assert result.details["opset"] == declared[""]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_onnx_transposed_weights_are_written_row_major_as_the_same_bytes(tmp_path, monkeypatch, precision):
    """`write_strided_weights_row_major`: the Linear weights the constant folding leaves as
    transposed views are the ones it takes, and the `.onnx` and its data file are byte for byte those
    written without it."""
    from edgex.exporters import EXPORTERS, onnx_weights

    rewrite, taken = onnx_weights.write_strided_weights_row_major, []

    def counting(model):
        taken.append(rewrite(model))
        return taken[-1]

    torch.manual_seed(0)
    module, x = nn.Sequential(*[nn.Linear(256, 256) for _ in range(3)]).eval(), torch.randn(1, 5, 256)
    comp = Component("stack", "test", module, [TensorSpec("x", (1, 5, 256), "float32")],
                     [TensorSpec("y", (1, 5, 256), "float32")], lambda t: (module(t),), {"s": (x,)})
    files = {}
    for label, writer in (("row-major", counting), ("as folded", lambda model: 0)):
        monkeypatch.setattr(onnx_weights, "write_strided_weights_row_major", writer)
        (tmp_path / label).mkdir()
        result = EXPORTERS.get("onnx").export(comp, precision, tmp_path / label / "s.onnx")
        files[label] = {p.name: p.read_bytes() for p in result.files}
    assert taken == [3]
    assert len(files["row-major"]) == 2 and files["row-major"] == files["as folded"]


def test_the_onnx_exporter_builds_torchlib_s_registry_once_and_writes_the_same_files(tmp_path, monkeypatch):
    """`torchlib_registry_built_once`: two exports build torchlib's registry once between them, each
    export gets a copy of its own (what one registers is not in the other), and the files are byte
    for byte those of exports that build their own."""
    import contextlib

    from torch.onnx._internal.exporter._registration import ONNXRegistry

    from edgex.exporters import EXPORTERS
    from edgex.exporters import onnx as onnx_exporter
    from edgex.patches import torch_onnx as torch_onnx_patches

    monkeypatch.setattr(torch_onnx_patches, "REGISTRIES", {})
    original, built = ONNXRegistry.__dict__["from_torchlib"], []

    def counting(cls, *args, **kwargs):
        built.append(kwargs.get("opset_version"))
        return original.__func__(cls, *args, **kwargs)

    monkeypatch.setattr(ONNXRegistry, "from_torchlib", classmethod(counting))
    files = {}
    for label, context in (("once", onnx_exporter.torchlib_registry_built_once), ("each", contextlib.nullcontext)):
        monkeypatch.setattr(onnx_exporter, "torchlib_registry_built_once", context)
        for run in ("1", "2"):
            (tmp_path / label / run).mkdir(parents=True)
            result = EXPORTERS.get("onnx").export(_stack_component(2, 16), "fp32", tmp_path / label / run / "s.onnx")
            files[label, run] = {p.name: p.read_bytes() for p in result.files}
        if label == "once":
            assert len(built) == 1
    assert len(built) == 3  # the two exports without it built one each
    assert files["once", "1"] == files["once", "2"] == files["each", "1"] == files["each", "2"]
    with onnx_exporter.torchlib_registry_built_once():
        first, second = ONNXRegistry.from_torchlib(opset_version=18), ONNXRegistry.from_torchlib(opset_version=18)
    target = next(iter(first.functions))
    first.functions[target].append("custom")
    assert "custom" not in second.functions[target] and second.opset_version == first.opset_version == 18
