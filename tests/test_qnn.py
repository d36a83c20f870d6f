"""Targets s25-htp / s24-htp: HTP context binaries + DLCs built by onnxruntime-qnn for the target's
SoC, run in the QAIRT x86 HTP simulator for parity; calibrated quantized schemes; refusals."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import cli_here, run_cli


def _artifacts(proc, sidecars: bool = False) -> dict:
    """Entries by (component, precision): the artifacts, or with `sidecars` the `.dlc` entries."""
    return {(a["component"], a["precision"]): a for a in json.loads(proc.stdout)["artifacts"] if ("sidecar_of" in a) == sidecars}


def test_s25_places_lm_roles_on_the_htp_and_code2wav_on_the_gpu_path(tmp_path):
    # The talker's step on s25-htp (fp16 context binary and .dlc) is exported, checked and corrupted
    # in test_fault_injection.py; the predictor step stands for the LM roles here, and latent2wav (the
    # decoder export quickest to build) for the decoders.
    proc = cli_here("export", "qwen3-tts", "--target", "s25-htp", "--preset", "tiny", "--out", str(tmp_path), "--json",
                   "-c", "code_predictor_step,latent2wav")
    data = json.loads(proc.stdout)
    # the .dlc entries are unverified here: status "incomplete", exit 3, the reason on stderr
    assert proc.returncode == 3 and data["status"] == "incomplete", proc.stderr[-3000:]
    assert "unverified" in proc.stderr and "--allow-unverified" in proc.stderr
    assert data["target_facts"]["htp_arch"] == "v79" and data["target_facts"]["soc_model"] == 69
    got = _artifacts(proc)
    assert set(got) == {("code_predictor_step", "fp16"), ("latent2wav", "fp32")}
    out = tmp_path / "qwen3-tts" / "s25-htp"
    for name in ("code_predictor_step",):
        a = got[(name, "fp16")]
        assert a["format"] == "qnn-context" and a["verdict"] == "pass", a["parity"]
        assert a["parity"]["method"] == "simulated" and a["parity"]["runtime"] == "qnn-htp-simulator"
        assert 35.0 < a["parity"]["min_snr_db"] < 80.0  # HTP fp16: real rounding, not a copy of eager
        assert a["details"]["htp_arch"] == "v79" and a["details"]["soc_model"] == 69 and a["details"]["qairt"]
        paths = [f["path"] for f in a["files"]]
        assert len(paths) == 2 and paths[0] == f"{name}.fp16.qnn.onnx" and paths[1].endswith(".bin")
        assert paths[1].encode() in (out / paths[0]).read_bytes()  # the EPContext model points at its binary
        # the .dlc runs apart from the context binary (its own backend session and weights): its own
        # entry, which nothing here runs, so it is unverified with the reason, never the binary's pass
        dlc = _artifacts(proc, sidecars=True)[(name, "fp16")]
        assert dlc["sidecar_of"] == paths[0] and dlc["format"] == "qnn-dlc" and dlc["verdict"] == "unverified"
        assert dlc["parity"]["method"] == "none" and "qnn-net-run" in dlc["parity"]["reason"]
        assert [f["path"].rsplit("/", 1)[-1] for f in dlc["files"]] == [f"{name}.fp16.dlc"]
        assert all((out / f["path"]).stat().st_size == f["bytes"] > 0 for f in a["files"] + dlc["files"])
    gpu = got[("latent2wav", "fp32")]
    assert gpu["format"] == "onnx" and gpu["parity"]["method"] == "runtime" and gpu["verdict"] == "pass"
    assert "Adreno" in gpu["placement"]["device"] and "not the GPU" in gpu["placement"]["unverified"]


# The tests of the s24 export run on one xdist worker: the module fixture is built once.
S24_GROUP = pytest.mark.xdist_group("qnn-s24")


@pytest.fixture(scope="module")
def s24(tmp_path_factory):
    """Tiny talker_decode for s24-htp in fp16, w8a16 and w4a16 (6 calibration sets), exported on one
    thread (torch's and ONNX Runtime's)."""
    out = tmp_path_factory.mktemp("s24")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")
        proc = run_cli("export", "qwen3-tts", "--target", "s24-htp", "--preset", "tiny", "--out", str(out), "--json",
                       "-c", "talker_decode", "-p", "fp16,w8a16,w4a16", "--calibration", "6", "--threads", "1")
    return out, proc


@S24_GROUP
def test_s24_w8a16_is_calibrated_for_v75_and_the_gate_fails_w4a16(s24):
    _, proc = s24
    got = _artifacts(proc)
    fp16, w8, w4 = (got[("talker_decode", p)] for p in ("fp16", "w8a16", "w4a16"))
    for a in (fp16, w8, w4):
        assert a["details"]["htp_arch"] == "v75" and a["details"]["soc_model"] == 57
    assert w8["details"]["calibration_sets"] == 6 and w8["details"]["activations"] == "QUInt16"
    assert w8["verdict"] == "pass", w8["parity"]
    assert fp16["parity"]["min_snr_db"] > w8["parity"]["min_snr_db"] > w4["parity"]["min_snr_db"]
    # 4-bit per-tensor weights are too coarse for this graph: the gate says so and the run exits 1.
    assert w4["verdict"] == "fail" and w4["files"][0]["path"].startswith("failed/")
    assert proc.returncode == 1
    # ... on the scheme, not the lowering: int4 weights are symmetric, which the HTP lowers faithfully
    # (with zero points it scored 3.7 dB against the scheme reference on the s25 binary)
    assert w4["details"]["weights"] == "QInt4" and w4["parity"]["lowering"]["verdict"] == "pass", w4["parity"]["lowering"]
    assert any(f.startswith("scheme: ") for f in w4["parity"]["failures"]), w4["parity"]["failures"]


@S24_GROUP
def test_a_w8a16_binary_exported_on_one_thread_verifies_on_two_and_another_qdq_graph_is_refused(s24, tiny, tmp_path, monkeypatch):
    """`edgex verify` makes the QDQ graph again in its own process, at its own thread count, and
    refuses a context binary whose recorded digest is not that graph's. The w8a16 binary exported on
    one thread verifies with torch, OpenMP and the runtime on two; a QDQ graph made from other
    calibration data (5 sets, not the 6 it was compiled from) is refused by the scheme reference and
    by the stored-tensor check alike."""
    from edgex.exporters import EXPORTERS

    out, _ = s24
    folder = tmp_path / "w8a16"
    shutil.copytree(out / "qwen3-tts" / "s24-htp", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["artifacts"] = [a for a in manifest["artifacts"] if a["precision"] == "w8a16"]  # the binary and its .dlc
    (folder / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    proc = run_cli("verify", str(folder), "--threads", "2", "--allow-unverified", "sidecar", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {a["format"]: a for a in json.loads(proc.stdout)["artifacts"]}
    binary = rows["qnn-context"]
    assert binary["verdict"] == "pass" and binary["method"] == "simulated" and binary["problem"] == "", binary
    assert binary["scheme"]["verdict"] == "pass" and float(binary["quantized_min_agreement_db"]) > 40, binary
    assert rows["qnn-dlc"]["verdict"] == "unverified", "the .dlc never runs here"

    _, components = tiny
    context = next(a for a in manifest["artifacts"] if a["format"] == "qnn-context")
    qnn, files = EXPORTERS.get("qnn"), [folder / f["path"] for f in context["files"]]
    with pytest.raises(RuntimeError, match="is not the one the context binary was compiled from"):
        qnn.scheme_reference(components["talker_decode"], "w8a16", files, calibration_size=5)
    refused = qnn.stored_quantized(components["talker_decode"], files, "w8a16", calibration_size=5)
    assert list(refused) == ["QDQ graph"], refused


def test_calibration_never_uses_the_parity_samples(tiny):
    _, components = tiny
    for name in ("talker_decode", "code_predictor_step", "code2latent"):
        comp = components[name]
        sets = comp.calibration(6)
        assert len(sets) == 6
        for inputs in sets:
            comp.check_inputs(inputs)
            for sample in comp.samples.values():
                assert not all(torch.equal(a, b) for a, b in zip(inputs, sample))
    steps = [int(s[2]) for s in components["code_predictor_step"].calibration(8)]
    assert max(steps) >= 14  # spread over the frame, not only its first steps


@pytest.mark.parametrize("args, message", [
    (["-t", "s99-htp"], "no such target 's99-htp'"),
    (["-t", "s25-htp", "-p", "w8"], "precision 'w8' is not supported by onnx, qnn on target s25-htp"),
    (["-t", "s25-htp", "--placement", "talker=qnn:fp32"], "exporter qnn does not support precision 'fp32'"),
    (["-t", "s25-htp", "--placement", "vocoder=qnn:fp16"], "no role 'vocoder' in qwen3-tts"),
    (["-t", "s25-htp", "--placement", "talker-qnn"], "bad --placement 'talker-qnn'"),
    (["-t", "cpu", "-f", "qnn"], "target cpu places none of qnn"),
])
def test_refusals_are_one_line(tmp_path, args, message):
    proc = run_cli("export", "qwen3-tts", "--preset", "tiny", "--out", str(tmp_path), *args)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not any(tmp_path.rglob("*.onnx"))


def test_spark_decode_w8a16_on_the_htp_keeps_the_gate_projection_float_and_its_table_is_read_back(tmp_path):
    """The w8a16 decode binary stores its embedding (the table the device gathers from, shared with
    the output head) as the QDQ graph's uint16 codes in two column blocks of 32: read back from
    there, every row scores far above the gate and the artifact passes. One row changed in the
    written binary fails it, naming the row."""
    import shutil

    import numpy as np
    import onnx
    from onnx import numpy_helper

    import edgex.exporters.qnn as qnn
    from edgex.exporters import EXPORTERS
    from edgex.parity.tensors import tensor_parity
    from edgex.recipes import RECIPES

    proc = cli_here("export", "spark-x2.5", "--target", "s25-htp", "--preset", "tiny", "--out", str(tmp_path), "--json",
                   "-c", "decode", "-p", "fp16,w8a16", "--allow-unverified", "sidecar")  # the .dlc sidecars cannot run here
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = _artifacts(proc)
    fp16, w8 = got[("decode", "fp16")], got[("decode", "w8a16")]
    assert fp16["verdict"] == "pass" and w8["verdict"] == "pass", w8.get("tensor_parity")
    assert fp16["parity"]["min_snr_db"] > w8["parity"]["min_snr_db"] > 10.0
    kept = w8["details"]["float_only"]
    assert kept["patterns"] == ["*.self_attn.g_proj"] and len(kept["nodes"]) == 4  # one per layer (tiny: 4)
    table = w8["tensor_parity"]["tensors"]["embedding"]
    assert table["type"] == "table, stored as 'model.embedding.weight_quantized'" and table["scored"] == "per row"
    assert table["snr_db"] > 60.0 and table["rows_below_gate"] == 0  # uint16 codes at one scale: 82.3 dB worst row

    out = tmp_path / "spark-x2.5" / "s25-htp"
    planted = tmp_path / "planted"
    planted.mkdir()
    files = [Path(shutil.copy(out / f["path"], planted)) for f in w8["files"]]
    binary_path = next(f for f in files if f.suffix == ".bin")
    recipe = RECIPES.get("spark-x2.5")
    (component,) = recipe.components(recipe.load("tiny", None, 0), ["decode"])
    graph, _ = qnn.GRAPHS.get(component, "w8a16", None)
    codes = next(numpy_helper.to_array(i) for i in onnx.load(str(graph)).graph.initializer
                 if i.name == "model.embedding.weight_quantized")
    binary = bytearray(binary_path.read_bytes())
    row = 4242
    at = binary.find(codes[row, :32].tobytes())
    assert at >= 0 and binary.find(codes[row, 32:].tobytes()) > at  # the two column blocks, in order
    binary[at:at + 64] = np.full(32, codes.max(), codes.dtype).tobytes()  # half of one row at the top code
    binary_path.write_bytes(bytes(binary))
    block = tensor_parity(EXPORTERS.get("qnn"), component, files, w8["parity"]["threshold_db"], "w8a16")
    assert block["verdict"] == "fail" and block["tensors"]["embedding"]["worst_row"] == row, block
    assert block["tensors"]["embedding"]["rows_below_gate"] == 1 and f"(row {row})" in block["failure"]


def test_the_graph_a_qnn_artifact_is_compiled_from_is_made_once(monkeypatch):
    """The fp32 ONNX graph is exported once per content (a sweep's next scheme of the same component
    reuses it: the tiny predictor frame's export is minutes); QDQ graphs once per component object
    (they depend on its calibration sets); nothing is shared across other weights."""
    import torch

    import edgex.exporters.qnn_graphs as qnn_graphs

    made = []

    def graph(_self, _component, _precision, dest):
        made.append("onnx")
        dest.write_bytes(b"graph")

    def quantize(_source, dest, _component, precision, size):
        made.append((precision, size))
        dest.write_bytes(b"qdq")
        return {"calibration_sets": size}

    monkeypatch.setattr(qnn_graphs.OnnxExporter, "graph", graph)
    monkeypatch.setattr(qnn_graphs, "for_the_htp", lambda dest: None)  # the stand-in graph is no ONNX
    monkeypatch.setattr(qnn_graphs, "quantize_qdq", quantize)
    monkeypatch.setattr(qnn_graphs, "run_forked_for", lambda component, label, fn, *args: fn(*args))  # counted here

    class Spec:
        def to_json(self):
            return {"name": "x", "shape": [1, 2], "dtype": "float32"}

    class Fake:  # what _Graphs reads of a Component
        def __init__(self, seed):
            torch.manual_seed(seed)
            self.name, self.module, self.inputs, self.outputs, self.calibration_size = "c", torch.nn.Linear(2, 2), [Spec()], [Spec()], 8

    graphs = qnn_graphs.Graphs()
    a = Fake(0)
    fp32, _ = graphs.get(a, "fp16", None)
    qdq = graphs.get(a, "w8a16", None)
    assert graphs.get(a, "w8a16", None) == qdq and made == ["onnx", ("w8a16", 8)]
    b = Fake(0)  # the next job: the same weights in a new component
    assert graphs.get(b, "fp16", None)[0] == fp32 and graphs.get(b, "w8a16", 16)[1] == {"calibration_sets": 16}
    graphs.get(b, "w8a16", None)
    assert made[2:] == [("w8a16", 16), ("w8a16", 8)], "QDQ graphs are made again for another component"
    graphs.get(Fake(1), "fp16", None)
    assert made[-1] == "onnx", "other weights, another fp32 graph"
    graphs.clear()
    assert not fp32.parent.exists()


def test_dlc_check_counts_only_weights_qairt_folds_as_unverified():
    """A weight missing from the .dlc is a failure unless every node reading it (looking through
    DequantizeLinear) computes from constants only, which ONNX Runtime folds before the .dlc is written (ACT's
    first decoder step, from a constant zero query): the LayerNorm of a constant is folded, a MatMul
    of the input is not, nor a quantized weight the input's MatMul reads."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np

    from edgex.exporters.qnn_dlc import folded_constants

    def init(name, shape):
        return numpy_helper.from_array(np.ones(shape, np.float32), name)

    scale, zero = numpy_helper.from_array(np.float32(0.1), "s"), numpy_helper.from_array(np.uint8(0), "z")
    q = numpy_helper.from_array(np.ones((4, 4), np.uint8), "q")
    nodes = [helper.make_node("LayerNormalization", ["c", "w", "b"], ["y"]),
             helper.make_node("MatMul", ["x", "m"], ["mx"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["dq"]),
             helper.make_node("MatMul", ["x", "dq"], ["qx"]),
             helper.make_node("Add", ["y", "mx"], ["a"]),
             helper.make_node("Add", ["a", "qx"], ["out"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4])],
                              [init("c", (1, 4)), init("w", (4,)), init("b", (4,)), init("m", (4, 4)), q, scale, zero])
    assert folded_constants(graph) == {"c", "w", "b"}


def test_a_bias_shared_by_several_nodes_quantizes_when_its_copy_name_is_taken(tmp_path):
    """ONNX Runtime's quantizer names its per-node copy of a shared bias `<bias><n>` counting only
    initializers; Diffusion Policy's DDIM loop (64 GroupNorms reading bias `val_16`) had its copy
    named like a Reshape output, `val_1636`, and quantization stopped. Here the copy of `v_1` would
    be `v_10`, the Reshape's output (without the fix the second norm silently reads the quantized
    Reshape output as its bias): edgex gives each reader its own bias first, with the same values."""
    from types import SimpleNamespace

    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgex.exporters.qnn_quantize import quantize_qdq

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=4).astype(np.float32), "v_1"),
             numpy_helper.from_array(np.ones(4, np.float32), "v_2"),
             numpy_helper.from_array(np.array([1, 4, 8], np.int64), "shape")]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["v_10"], name="reshape"),
             helper.make_node("InstanceNormalization", ["v_10", "v_2", "v_1"], ["a"], name="norm_a"),
             helper.make_node("InstanceNormalization", ["a", "v_2", "v_1"], ["y"], name="norm_b")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])], inits)
    source = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    component = SimpleNamespace(name="g", inputs=[SimpleNamespace(name="x")], outputs=[], float_only=(),
                                calibration=lambda n: [(torch.randn(1, 32),) for _ in range(n)])
    quantize_qdq(source, tmp_path / "q.onnx", component, "w8a16", 2)
    quantized = onnx.load(str(tmp_path / "q.onnx"))
    biases = [n.input[2] for n in quantized.graph.node if n.op_type == "InstanceNormalization"]
    assert len(set(biases)) == 2 and all(b.startswith("v_1.edgex_bias") for b in biases), biases


def test_the_graph_is_made_in_a_process_forked_for_it_and_only_its_file_comes_back(tmp_path, monkeypatch):
    """torch's export and onnxscript's rewrites leave memory behind in the process that runs them
    (1.1 GB of a 0.6b talker's job, held to its end): `Graphs` makes each graph in a child forked for
    it, into its own folder, and what the child computed for the component comes back."""
    import os

    import torch

    import edgex.exporters.qnn_graphs as qnn_graphs
    from edgex.component import Component, TensorSpec

    def graph(_self, component, _precision, dest):
        component.computed_here = True  # stands for what the export leaves behind in its process
        dest.write_text(str(os.getpid()))

    monkeypatch.setattr(qnn_graphs.OnnxExporter, "graph", graph)
    monkeypatch.setattr(qnn_graphs, "for_the_htp", lambda dest: None)  # the stand-in graph is no ONNX
    module = torch.nn.Linear(2, 2)
    comp = Component("c", "test", module, [TensorSpec("x", (1, 2), "float32")], [TensorSpec("y", (1, 2), "float32")],
                     lambda x: module(x), {})
    graphs = qnn_graphs.Graphs()
    try:
        path, _ = graphs.get(comp, "fp16", None)
        assert int(path.read_text()) != os.getpid()  # made in another process, the file kept
        assert not hasattr(comp, "computed_here")
        assert graphs.get(comp, "fp16", None)[0] == path
    finally:
        graphs.clear()


def test_a_qnn_job_makes_the_graph_it_compiles_once_in_its_own_process(tmp_path, monkeypatch):
    """The lowering runs in a process forked from the job's, and the job's scheme reference and
    stored-tensor checks read the compiled graph again after it: the job's process has that graph
    made (`QnnExporter.before_lowering`, in a process forked for it) and the lowering's reads it, so
    each job exports it once. When only the lowering's process made it, every QNN job exported its
    fp32 ONNX graph twice."""
    import os

    import edgex.exporters.qnn as qnn
    import edgex.exporters.qnn_graphs as qnn_graphs
    from edgex.export import export_model

    log = tmp_path / "made"
    graph = qnn_graphs.OnnxExporter.graph

    def recording(self, component, precision, dest, **kwargs):
        with open(log, "a") as f:
            f.write(f"{component.name} {os.getpid()}\n")
        return graph(self, component, precision, dest, **kwargs)

    monkeypatch.setattr(qnn_graphs.OnnxExporter, "graph", recording)
    fresh = qnn_graphs.Graphs()  # not the graphs an earlier test on this worker made for the same tiny weights
    monkeypatch.setattr(qnn, "GRAPHS", fresh)
    try:
        manifest = export_model("qwen3-tts", "s25-htp", tmp_path / "out", preset="tiny", components=["talker_decode"],
                                precisions=["fp16", "w8a16"], calibration_size=2, allow_unverified=["sidecar"])
    finally:
        fresh.clear()
    entries = [a for a in manifest["artifacts"] if "sidecar_of" not in a]
    assert [a["parity"]["method"] for a in entries] == ["simulated", "simulated"]  # each job ran its binary
    made = log.read_text().splitlines()
    assert len(made) == 2 and len(set(made)) == 2, made  # one per job, each in its own job's process


def test_calibration_runs_on_one_thread_whatever_the_process_runs_on(tmp_path, monkeypatch):
    """`edgex verify` makes a QDQ graph again in its own process and refuses one whose digest differs
    from the context binary's record; the export calibrated in a forked job on one thread. So the
    eager calibration sets and ONNX Runtime's calibration session run on one thread whatever this
    process's thread count (a reduction split over more threads can move a range in its last bits),
    and the thread count is restored after."""
    import numpy as np
    import onnx
    import onnxruntime
    from types import SimpleNamespace

    from onnx import TensorProto, helper, numpy_helper

    from edgex.exporters.qnn_quantize import quantize_qdq

    weight = numpy_helper.from_array(np.random.default_rng(0).normal(size=(32, 32)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], [weight])
    source = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    seen = {"torch": [], "ort": []}

    def calibration(n):
        seen["torch"].append(torch.get_num_threads())
        return [(torch.randn(4, 32, generator=torch.Generator().manual_seed(i)),) for i in range(n)]

    session = onnxruntime.InferenceSession

    def spy(path, sess_options=None, **kwargs):
        seen["ort"].append((sess_options.intra_op_num_threads, sess_options.inter_op_num_threads) if sess_options else None)
        return session(path, sess_options=sess_options, **kwargs)

    monkeypatch.setattr(onnxruntime, "InferenceSession", spy)
    component = SimpleNamespace(name="g", inputs=[SimpleNamespace(name="x")], outputs=[], float_only=(), calibration=calibration)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        quantize_qdq(source, tmp_path / "q.onnx", component, "w8a16", 2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert seen["torch"] == [1] and seen["ort"] and all(s == (1, 1) for s in seen["ort"]), seen


def test_a_dlc_much_larger_than_its_context_binary_is_not_written_and_the_entry_says_why(tmp_path, monkeypatch):
    """A `.dlc` more than 1.25 times the context binary and EPContext model it is another build of
    is not written, and the artifact's manifest entry says why (`sidecars_not_written`); no `.dlc`
    entry or file is left. Here the `.dlc` keeps its MatMul weights in fp32 (no reader takes an fp16
    weight: `HALF_READERS` empty), 2.1 MB beside the binary's 1.1 MB, as every fp16 `.dlc` did when
    it was written from the fp32 graph as it is."""
    import tempfile

    from torch import nn

    import edgex.exporters.qnn as qnn
    import edgex.exporters.qnn_dlc as qnn_dlc
    import edgex.exporters.qnn_graphs as qnn_graphs
    from edgex.component import Component, TensorSpec
    from edgex.export import _export_one
    from edgex.exporters import EXPORTERS
    from edgex.plan import Job
    from edgex.targets import get_target

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 512)).eval()
    x = torch.randn(1, 512)
    component = Component("stack", "talker", module, [TensorSpec("x", (1, 512), "float32")], [TensorSpec("y", (1, 512), "float32")],
                          lambda t: (module(t),), {"s": (x,)})
    monkeypatch.setattr(qnn_dlc, "HALF_READERS", {})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the graph store's folder, removed with tmp_path
    monkeypatch.setattr(qnn, "GRAPHS", qnn_graphs.Graphs())
    options = tuple(get_target("s25-htp").exporter_options["qnn"].items())
    (stage := tmp_path / "stage").mkdir()
    entries = _export_one(Job("stack", "talker", "qnn", "fp16", options), component, EXPORTERS.get("qnn"), stage, {}, None, None)
    (entry,) = entries
    assert entry["verdict"] == "pass" and not list(stage.rglob("*.dlc")), entry.get("parity", {}).get("failures")
    runnable = sum(f["bytes"] for f in entry["files"])
    why = entry["sidecars_not_written"]["qnn-dlc"]
    assert why.startswith("not written: QAIRT's IR backend wrote a 2.1 MB .dlc, 1.87 x the") and "at most 1.25 x" in why, why
    assert f"x the {runnable / 1e6:.1f} MB of the context binary and EPContext model" in why


def test_identical_initializers_merge_for_the_dlc_except_where_a_subgraph_or_output_names_them():
    """`merged_duplicates`: an initializer of the same bytes as an earlier one is removed and its
    readers read that one; one a subgraph reads (an If branch, which names it from outside) or a graph
    output names stays, and so does one of the same bytes that the fp16 `.dlc` keeps in another dtype."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from edgex.exporters.qnn_dlc import merged_duplicates

    ones = np.ones((2, 2), np.float32)
    branch = helper.make_graph([helper.make_node("Add", ["b", "b"], ["o"])], "branch", [],
                               [helper.make_tensor_value_info("o", TensorProto.FLOAT, [2, 2])])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch),
                               helper.make_node("Add", ["a", "d"], ["z"]), helper.make_node("MatMul", ["z", "h"], ["w"])], "g",
                              [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("w", TensorProto.FLOAT, [2, 2]),
                               helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 2])],
                              [numpy_helper.from_array(ones, n) for n in ("a", "b", "d", "e", "h")])
    assert merged_duplicates(graph, half={"h"}) == 1
    assert [i.name for i in graph.initializer] == ["a", "b", "e", "h"]
    assert [list(n.input) for n in graph.node] == [["c"], ["a", "a"], ["z", "h"]]


def _padded_graph(path: Path, pads: list[int], shape: list[int], after: int, value: float = 0.0, width: int = 960) -> Path:
    """x -> constant Pad -> a flattening MatMul to `width`, concatenated under `after` rows of a
    second input, then `width`-wide matmuls (the layout that gives the Pad's output a reused buffer
    on the HTP); the padded tensor is an output too."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    padded = [d + pads[i] + pads[i + len(shape)] for i, d in enumerate(shape)]
    flat = int(np.prod(padded[1:]))
    inits = [numpy_helper.from_array(np.array(pads, np.int64), "pads"),
             numpy_helper.from_array(np.array([value], np.float32), "value"),
             numpy_helper.from_array(np.array([1, 1, flat], np.int64), "flat"),
             numpy_helper.from_array((rng.standard_normal((flat, width)) * 0.1).astype(np.float32), "w")]
    nodes = [helper.make_node("Pad", ["x", "pads", "value"], ["padded"], mode="constant"),
             helper.make_node("Reshape", ["padded", "flat"], ["row"]),
             helper.make_node("MatMul", ["row", "w"], ["projected"]),
             helper.make_node("Concat", ["rows", "projected"], ["h0"], axis=1)]
    for i in range(4):
        inits.append(numpy_helper.from_array((rng.standard_normal((width, width)) * 0.03).astype(np.float32), f"m{i}"))
        nodes += [helper.make_node("MatMul", [f"h{i}", f"m{i}"], [f"p{i}"]), helper.make_node("Add", [f"h{i}", f"p{i}"], [f"h{i + 1}"])]
    graph = helper.make_graph(
        nodes, "padded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape),
                          helper.make_tensor_value_info("rows", TensorProto.FLOAT, [1, after, width])],
        [helper.make_tensor_value_info("h4", TensorProto.FLOAT, [1, after + 1, width]),
         helper.make_tensor_value_info("padded", TensorProto.FLOAT, padded)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    onnx.save(model, str(path))
    return path


def test_constant_pads_reach_the_htp_as_concatenations_that_write_every_call(tmp_path):
    # The HTP leaves a constant Pad's padding unwritten where its output buffer is reused: later calls
    # read the previous call's leftovers (SmolVLA 450m's prefix failed its fp16 gate so on its second
    # sample). The graph a QNN artifact is compiled from has none; every call matches ONNX Runtime CPU.
    import numpy as np
    import onnx
    import onnxruntime as ort

    from edgex.exporters.qnn_htp import pads_as_concats
    from edgex.parity.metrics import snr_db
    from edgex.qnn import htp_session

    original = _padded_graph(tmp_path / "original.onnx", [0, 0, 0, 26], [1, 6], after=112)
    rewritten = shutil.copy(original, tmp_path / "rewritten.onnx")
    assert pads_as_concats(rewritten) == 1
    assert [n.op_type for n in onnx.load(str(rewritten)).graph.node if n.op_type == "Pad"] == []
    cpu = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"])
    htp = htp_session(rewritten, fp16=True, soc_model=69, htp_arch=79)
    rng = np.random.default_rng(1)
    for _ in range(4):
        feed = {"x": rng.standard_normal((1, 6)).astype(np.float32), "rows": rng.standard_normal((1, 112, 960)).astype(np.float32)}
        want, got = cpu.run(None, feed), htp.run(None, feed)
        assert np.abs(got[1][:, 6:]).max() == 0.0  # the padding, as written on this call
        assert min(snr_db(w, g) for w, g in zip(want, got)) > 45.0


def test_a_pad_on_several_axes_with_a_value_becomes_concatenations_of_the_same_result(tmp_path):
    import numpy as np
    import onnx
    import onnxruntime as ort

    from edgex.exporters.qnn_htp import pads_as_concats

    original = _padded_graph(tmp_path / "original.onnx", [0, 0, 2, 0, 0, 0, 1, 3], [1, 2, 3, 4], after=3, value=-1.5, width=16)
    rewritten = shutil.copy(original, tmp_path / "rewritten.onnx")
    assert pads_as_concats(rewritten) == 1
    ops = [n.op_type for n in onnx.load(str(rewritten)).graph.node]
    assert "Pad" not in ops and ops.count("Concat") == 3  # the rows' Concat + one per padded axis
    feed = {"x": np.random.default_rng(2).standard_normal((1, 2, 3, 4)).astype(np.float32),
            "rows": np.zeros((1, 3, 16), np.float32)}
    want = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"]).run(None, feed)
    got = ort.InferenceSession(str(rewritten), providers=["CPUExecutionProvider"]).run(None, feed)
    assert all(np.array_equal(w, g) for w, g in zip(want, got))


def test_a_short_rows_convolution_padding_reaches_the_htp_as_a_matmul_that_keeps_it_exact(tmp_path):
    # The HTP's fp16 Conv over a row of width 8 padding 2 per side is wrong (Diffusion Policy pusht's
    # U-Net at width 8 failed its gate so); written as zero Concats after another Conv it is folded
    # back and just as wrong. The graph a QNN artifact is compiled from pads such a row by a MatMul.
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edgex.exporters.qnn_htp import row_conv_pads_as_matmuls
    from edgex.parity.metrics import snr_db
    from edgex.qnn import htp_session

    rng = np.random.default_rng(4)
    channels, width = 64, 8
    inits = [numpy_helper.from_array((rng.standard_normal((channels, channels, 1)) / 8).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((channels, channels, 5)) / 18).astype(np.float32), "w5")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["h"], name="pointwise", kernel_shape=[1]),
             helper.make_node("Conv", ["h", "w5"], ["y"], name="wide", kernel_shape=[5], pads=[2, 2])]
    graph = helper.make_graph(nodes, "row", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, width])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, channels, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    original, rewritten = tmp_path / "original.onnx", tmp_path / "rewritten.onnx"
    onnx.save(model, str(original))
    shutil.copy(original, rewritten)
    assert row_conv_pads_as_matmuls(rewritten) == 1  # the 1-wide Conv pads nothing
    feed = {"x": rng.standard_normal((1, channels, width)).astype(np.float32)}
    want = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert np.array_equal(ort.InferenceSession(str(rewritten), providers=["CPUExecutionProvider"]).run(None, feed)[0], want)
    soc = {"soc_model": 69, "htp_arch": 79}
    assert snr_db(want, htp_session(original, fp16=True, **soc).run(None, feed)[0]) < 10.0  # the HTP's own defect
    assert snr_db(want, htp_session(rewritten, fp16=True, **soc).run(None, feed)[0]) > 45.0


def test_a_table_stored_in_power_of_two_column_blocks_with_a_narrower_last_one_is_read_back():
    # SmolVLA 450m's fp16 token embedding [49280, 960] sits in its context binary as blocks of 256
    # columns and a last one of 192, each rows-contiguous; no equal split of 960 columns finds it.
    import numpy as np

    from edgex.exporters.qnn_tables import located

    table = np.random.default_rng(3).standard_normal((300, 120)).astype(np.float16)
    blocks = [table[:, start:start + 32] for start in range(0, 120, 32)]  # 32, 32, 32, 24 columns
    data = b"header" + b"".join(np.ascontiguousarray(b).tobytes() + b"\0" * 40 for b in blocks)
    got = located(data, table)
    assert got is not None and np.array_equal(got, table)
    assert located(data, np.ascontiguousarray(table[:, ::-1])) is None  # another table is not found


def test_the_dlc_check_holds_one_weight_at_a_time(tmp_path, monkeypatch):
    """The `.dlc`'s stored-tensor check scores every weight of the graph it was written from: it
    reads each from the graph's external data when it scores it, so it holds the `.dlc`'s tensor
    data and a weight or two at once, not every weight twice as float32 (3.7 GB at a 0.6b talker)."""
    import tempfile
    import tracemalloc

    from torch import nn

    import edgex.exporters.qnn as qnn
    import edgex.exporters.qnn_graphs as qnn_graphs
    from edgex.component import Component, TensorSpec
    from edgex.exporters import EXPORTERS
    from edgex.parity.tensors import tensor_parity
    from edgex.targets import get_target

    torch.manual_seed(0)
    module = nn.Sequential(*(nn.Linear(512, 512) for _ in range(8))).eval()
    x = torch.randn(1, 512)
    component = Component("stack", "talker", module, [TensorSpec("x", (1, 512), "float32")], [TensorSpec("y", (1, 512), "float32")],
                          lambda t: (module(t),), {"s": (x,)})
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the graph store's folder, removed with tmp_path
    monkeypatch.setattr(qnn, "GRAPHS", qnn_graphs.Graphs())
    exporter = EXPORTERS.get("qnn")
    options = get_target("s25-htp").exporter_options["qnn"]
    result = exporter.export(component, "fp16", tmp_path / f"stack{exporter.extension}", **options)
    (dlc,) = result.sidecars[0].files
    weights = 8 * 512 * 512 * 4  # every fp32 weight
    tracemalloc.start()
    try:
        block = tensor_parity(exporter, component, [dlc], 30.0, "fp16", options)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert block["verdict"] == "pass" and len(block["tensors"]) == 16, block  # 8 weights, 8 biases, each found
    # the .dlc's tensor data, and one weight at a time (its stored and eager arrays, its SNR's float64
    # temporaries): well under every weight held twice beside it, as the check held them
    assert peak < dlc.stat().st_size + 2 * weights, f"{peak / 2**20:.1f} MiB at the peak"
