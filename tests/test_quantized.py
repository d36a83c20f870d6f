"""Stored quantized tensors against an independent quantizer (edgex.parity.quantizer / .quantized),
and QNN's scheme reference made from the QDQ graph's numbers in eager PyTorch, never its operators."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from conftest import cli_here
from edgex.parity.metrics import snr_db
from edgex.parity.quantizer import QDQ_CHANNEL_SCHEMES, QDQ_SCHEMES, SCHEMES, fake_quantize

_W = (np.random.default_rng(0).standard_normal((96, 128)) * 0.05).astype(np.float32)


def _tool_dequantized(key):
    """What each format's own tool stores for `_W`, dequantized (the libraries the exporters use)."""
    exporter, precision = key
    if exporter == "gguf":
        import gguf

        qtype = gguf.GGMLQuantizationType[precision.upper()]
        return gguf.quants.dequantize(gguf.quants.quantize(_W, qtype), qtype).reshape(_W.shape)
    if exporter == "executorch":
        import torch
        from torchao.quantization import quantize_
        from torchao.quantization.granularity import PerAxis, PerGroup
        from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

        granularity = PerAxis(0) if precision == "8da8w" else PerGroup(32)
        layer = torch.nn.Sequential(torch.nn.Linear(128, 96, bias=False))
        layer[0].weight.data = torch.from_numpy(_W.copy())
        quantize_(layer, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int8 if precision == "8da8w" else torch.int4,
                                                               weight_granularity=granularity))
        weight = layer[0].weight
        if precision == "8da8w":
            return weight.dequantize().float().numpy()
        # ExecuTorch's XNNPACK serializer writes per-group scales in bfloat16 (node_visitor.get_quant_params)
        scale = weight.scale.to(torch.bfloat16).float().repeat_interleave(32, dim=1)
        return (weight.qdata.float() * scale).numpy()
    if exporter == "coreml":
        from coremltools.converters.mil.mil.ops.defs.iOS18 import compression
        from coremltools.optimize._utils import compute_qparams

        bits, blocks = (8, [1, 0]) if precision == "w8" else (4, [1, 32])
        q, scale, _ = compute_qparams(_W.astype(np.float16), bits, True, "LINEAR_SYMMETRIC", None, blocks)
        return compression.constexpr_blockwise_shift_scale.decompress(q, scale, None).astype(np.float32)
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType, quantize_nparray

    # per tensor (`qdq`): uint8 asymmetric, int4 and int8 symmetric; per channel (`qdq-channel`): all symmetric
    qtype = {"uint8": TensorProto.UINT8, "int4": TensorProto.INT4, "int8": TensorProto.INT8}[precision]
    symmetric = exporter == "qdq-channel" or precision != "uint8"
    qmin, qmax = get_qmin_qmax_for_qType(qtype, symmetric=symmetric)
    rows = []
    for row in _W:
        zero, scale = compute_scale_zp(np.array(row.min()), np.array(row.max()), qmin, qmax, symmetric,
                                       min_real_range=None if precision == "int8" else 1e-4)
        rows.append((quantize_nparray(qtype, row, scale, zero).astype(np.float32) - float(zero)) * scale)
    return np.array(rows, np.float32)


@pytest.mark.parametrize("key", [k for k in SCHEMES if k[0] in ("gguf", "executorch", "coreml")] + [("qdq", t) for t in QDQ_SCHEMES]
                         + [("qdq-channel", t) for t in QDQ_CHANNEL_SCHEMES])
def test_the_independent_quantizer_reproduces_each_formats_codes(key):
    """Written from the formats' definitions, it reproduces their own tools' codes exactly on a
    Gaussian weight (the agreement `parity.quantized` gates at 60 dB); its own SNR is recorded.
    QDQ per channel (`qdq-channel`, a Conv kernel's rows) is symmetric whatever the type."""
    scheme = {"qdq": QDQ_SCHEMES, "qdq-channel": QDQ_CHANNEL_SCHEMES}[key[0]][key[1]] if key[0].startswith("qdq") else SCHEMES[key]
    ours = fake_quantize(_W, scheme)
    assert np.array_equal(ours, _tool_dequantized(key)), key
    assert snr_db(_W, ours) > (38 if scheme.bits == 8 else 17)


@pytest.mark.parametrize("qtype, schemes", [("uint8", QDQ_SCHEMES), ("int4", QDQ_SCHEMES), ("uint8", QDQ_CHANNEL_SCHEMES)])
def test_qdq_constants_of_tiny_range_take_the_htp_minimum_range(qtype, schemes):
    """The QNN quantizer config widens every range to at least 1e-4 (`MinimumRealRange`), before a
    symmetric range is made: an RMSNorm's eps of 1e-6 is stored as uint8 code 3 at scale 1e-4 / 255
    (1.18e-6). The independent quantizer reproduces ONNX Runtime's codes on such constants and on a
    Gaussian row alike, asymmetric and symmetric."""
    from onnx import TensorProto
    from onnxruntime.quantization.quant_utils import compute_scale_zp, get_qmin_qmax_for_qType, quantize_nparray

    onnx_type = {"uint8": TensorProto.UINT8, "int4": TensorProto.INT4}[qtype]
    scheme = schemes[qtype]
    symmetric = scheme.scale_rule == "symmetric_range"
    qmin, qmax = get_qmin_qmax_for_qType(onnx_type, symmetric=symmetric)
    for weight in (np.full((1, 1), 1e-6, np.float32), np.array([[3e-5, -2e-5, 1e-5, 0.0]], np.float32), _W[:1]):
        zero, scale = compute_scale_zp(np.array(weight.min()), np.array(weight.max()), qmin, qmax, symmetric, min_real_range=1e-4)
        tool = (quantize_nparray(onnx_type, weight, scale, zero).astype(np.float32) - float(zero)) * scale
        assert np.array_equal(fake_quantize(weight, scheme), tool), (qtype, scheme.name, weight)


@pytest.fixture(scope="module")
def onnx_8da4w(tmp_path_factory):
    out = tmp_path_factory.mktemp("quantized")
    proc = cli_here("export", "qwen3-tts", "--preset", "tiny", "--target", "cpu", "-c", "talker_decode", "-f", "onnx",
                   "-p", "8da4w", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / "qwen3-tts" / "cpu"


def test_8da4w_onnx_with_doubled_down_projection_scales_fails_verify_naming_the_tensor(onnx_8da4w, tmp_path):
    """The run alone passes such a file (its scheme reference is read from the same file: 15.1 dB
    against the 5 dB gate); the stored-tensor check fails it at export and in `edgex verify`."""
    import shutil

    from edgex.artifacts.files import file_records

    manifest = json.loads((onnx_8da4w / "manifest.json").read_text())
    (entry,) = manifest["artifacts"]
    assert entry["verdict"] == "pass" and entry["quantized_parity"]["verdict"] == "pass"
    assert entry["quantized_parity"]["tensors_checked"] == 15 and entry["quantized_parity"]["min_agreement_db"] > 100
    broken = tmp_path / "cpu"
    shutil.copytree(onnx_8da4w, broken)
    path = broken / "talker_decode.8da4w.onnx"
    model = onnx.load(str(path))
    scales = next(i for i in model.graph.initializer if i.name == "edgex.linear.model.layers.0.mlp.down_proj_scales")
    scales.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scales) * 2, scales.name))
    (broken / (path.name + ".data")).unlink()
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=path.name + ".data")
    manifest["artifacts"][0]["files"] = [r for p in (path, broken / (path.name + ".data")) for r in file_records(p, broken)]
    (broken / "manifest.json").write_text(json.dumps(manifest))
    proc = cli_here("verify", str(broken), "--json")
    assert proc.returncode == 1, proc.stderr[-2000:]
    (row,) = json.loads(proc.stdout)["artifacts"]
    assert row["files"] == "ok" and row["min_snr_db"] >= row["threshold_db"]  # the run alone passes it
    assert "edgex.linear.model.layers.0.mlp.down_proj_Q4" in row["problem"] and row["verdict"] == "fail"


@pytest.fixture(scope="module")
def talker_decode():
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    (component,) = recipe.components(recipe.load("tiny", None, 0), ["talker_decode"])
    return component


def test_gguf_tensor_with_zero_points_off_or_a_head_zeroed_fails(talker_decode, tmp_path):
    """GGUF q4_0 written faithfully agrees with the independent ggml quantizer (78.8 dB, float rounding); one head of
    q_proj zeroed in the written file, or one tensor's codes all off by one step, fails it."""
    import gguf

    from edgex.exporters import EXPORTERS
    from edgex.parity.quantized import quantized_parity

    exporter = EXPORTERS.get("gguf")
    files = exporter.export(talker_decode, "q4_0", tmp_path / "t.q4_0.gguf").files
    good = quantized_parity(exporter, talker_decode, files, "q4_0")
    assert good["verdict"] == "pass" and good["min_agreement_db"] > 70
    reader = gguf.GGUFReader(str(files[0]), "r+")
    tensors = {t.name: t for t in reader.tensors}
    q = next(t for n, t in tensors.items() if n.endswith("attn_q.weight") and t.tensor_type.name == "Q4_0")
    q.data[: q.data.shape[0] // 8] = 0  # the first eighth of the rows: at least one head
    k = next(t for n, t in tensors.items() if n.endswith("attn_k.weight") and t.tensor_type.name == "Q4_0")
    codes = k.data.reshape(-1, 18)[:, 2:]  # ggml block: fp16 scale, 16 bytes of nibbles
    codes[:] = (codes & 0xF0) | np.minimum((codes & 0x0F) + 1, 15)  # low nibbles one step up
    reader.data.flush()
    del reader
    bad = quantized_parity(exporter, talker_decode, files, "q4_0")
    failed = {f.split(":")[0] for f in bad["failures"]}
    assert bad["verdict"] == "fail" and failed == {q.name, k.name}, bad["failures"]


def test_qnn_w8a16_reference_is_the_eager_model_and_a_bias_added_twice_fails(talker_decode, tmp_path, monkeypatch):
    """The QDQ scheme reference runs eager PyTorch with the graph's weights and scales (never the
    graph); the fp32 graph it was made from scores against eager at the fp32 gate. A bug planted in
    the ONNX export path (v_proj's result added twice, as a bias added twice would be) is in the QDQ
    graph and the binary alike, so a QDQ graph reference would cancel it; here the fp32 graph's
    figure fails it, and so does the lowering against eager."""
    import edgex.exporters.qnn as qnn
    import edgex.exporters.qnn_graphs as qnn_graphs
    from edgex.export import run_parity
    from edgex.exporters import EXPORTERS
    from edgex.parity.quantized import quantized_parity
    from edgex.targets import get_target

    exporter, options = EXPORTERS.get("qnn"), get_target("s25-htp").exporter_options["qnn"]

    def export(name):
        result = exporter.export(talker_decode, "w8a16", tmp_path / name / "talker_decode.w8a16.qnn.onnx", **options)
        report = run_parity(talker_decode, exporter, result.files, result.io_float_dtype, "w8a16", None, None, options)
        return result, report

    (tmp_path / "good").mkdir()
    good_result, good = export("good")
    assert good.verdict == "pass", good.failures
    assert good.scheme["source"].startswith("eager model with the QDQ graph's weights") and "graph_sha256" in good.scheme
    assert good.scheme["float_graph"]["verdict"] == "pass" and good.scheme["float_graph"]["min_snr_db"] > 100
    for files in (good_result.files, good_result.sidecars[0].files):
        block = quantized_parity(exporter, talker_decode, files, "w8a16")
        assert block["verdict"] == "pass" and block["tensors_checked"] >= 15, block["failures"]
    _dlc_zero_point_off_by_one_fails(exporter, talker_decode, good_result.sidecars[0].files[0], tmp_path)

    graph = qnn_graphs.OnnxExporter.graph

    def twice(self, component, precision, dest, for_onnxruntime=False):  # one linear's result added twice
        result = graph(self, component, precision, dest, for_onnxruntime)
        model = onnx.load(str(dest))
        node = next(n for n in model.graph.node if n.op_type == "MatMul" and "v_proj" in str(n.metadata_props))
        extra = onnx.helper.make_node("Add", [node.output[0] + "_once"] * 2, [node.output[0]], name=node.name + "_twice")
        node.output[0] += "_once"
        model.graph.node.insert(list(model.graph.node).index(node) + 1, extra)
        onnx.save(model, str(dest), save_as_external_data=True, all_tensors_to_one_file=True, location=dest.name + ".data")
        return result

    qnn.GRAPHS.clear()
    monkeypatch.setattr(qnn_graphs.OnnxExporter, "graph", twice)
    (tmp_path / "bad").mkdir()
    try:
        _, bad = export("bad")
    finally:
        qnn.GRAPHS.clear()
    assert bad.verdict == "fail" and bad.lowering["verdict"] == "fail", bad.lowering["min_snr_db"]
    assert bad.scheme["float_graph"]["verdict"] == "fail"
    assert any(f.startswith("reference: the fp32 graph") for f in bad.failures)


def _dlc_zero_point_off_by_one_fails(exporter, component, dlc, tmp_path):
    """The `.dlc` stores each per-tensor scale with its zero point as QNN's scale-offset pair
    (float32 scale, int32 -zero point): one weight's zero point one step off in the written file
    fails that tensor, though its integers and scale are untouched."""
    import shutil

    import edgex.exporters.qnn as qnn
    from edgex.exporters.qdq_scheme import dequantized_constants
    from edgex.parity.quantized import quantized_parity

    graph, _ = qnn.GRAPHS.get(component, "w8a16", None)
    name, (_, _q, scale, zero, _axis) = next((n, c) for n, c in dequantized_constants(onnx.load(str(graph))).items()
                                             if c[1].dtype == np.uint8 and c[1].ndim == 2 and c[2].size == 1 and int(c[3]) != 0)
    pair = np.float32(scale.reshape(-1)[0]).tobytes() + np.int32(-int(zero)).tobytes()
    planted = tmp_path / "planted" / dlc.name
    planted.parent.mkdir()
    shutil.copy(dlc, planted)
    data = planted.read_bytes()
    at = data.find(pair)
    assert at >= 0
    planted.write_bytes(data[:at + 4] + np.int32(-int(zero) - 1).tobytes() + data[at + 8:])
    block = quantized_parity(exporter, component, [planted], "w8a16")
    assert block["verdict"] == "fail" and [f.split(":")[0] for f in block["failures"]] == [name], block["failures"]
    assert "scales / zero points not found in the .dlc" in block["failures"][0]


@pytest.mark.parametrize("name, precision", [("executorch", "8da4w"), ("mnn", "w4")])
def test_a_file_with_one_layers_scales_doubled_fails_its_stored_tensor_check(talker_decode, tmp_path, name, precision):
    """The `.pte`'s XNNPACK weights and the `.mnn`'s Convolution weights are read back from the file
    and agree with the independent quantizer (ExecuTorch: exact codes and the bfloat16 group scales
    XNNPACK stores, inf dB; MNN: exact codes, float rounding of its min arithmetic, ~144 dB); the same
    file with layer 0's down-projection scales doubled in place fails, naming that weight. The
    model-parity run alone passes such a file: its scheme reference reads the same weights."""
    from planted_files import DOWN, plant_mnn, plant_pte

    from edgex.exporters import EXPORTERS
    from edgex.parity.quantized import quantized_parity

    exporter = EXPORTERS.get(name)
    files = exporter.export(talker_decode, precision, tmp_path / f"t.{precision}{exporter.extension}").files
    good = quantized_parity(exporter, talker_decode, files, precision)
    assert good["verdict"] == "pass" and good["tensors_checked"] >= 15 and good["min_agreement_db"] > 120, good["failures"]
    assert DOWN in good["tensors"]
    (plant_pte if name == "executorch" else plant_mnn)(files[0], talker_decode, "scales x2")
    bad = quantized_parity(exporter, talker_decode, files, precision)
    assert bad["verdict"] == "fail" and [f.split(":")[0] for f in bad["failures"]] == [DOWN], bad["failures"]
    assert bad["tensors"][DOWN]["agreement_db"] < 1


@pytest.mark.parametrize("precision", ["w8a16", "w4a16"])
def test_dlc_per_channel_scales_and_zero_points_are_each_checked(tmp_path, precision):
    """A Conv kernel's QDQ weights are per channel and symmetric (ONNX Runtime makes every
    per-channel initializer so: uint8 at zero point 128, int4 at 0), and the `.dlc` holds one
    scale-offset pair per channel. The independent quantizer reproduces them, each channel's pair is
    found in the `.dlc`, and one channel's zero point one step off (w8a16) or one channel's scale
    doubled in the written file fails that kernel alone."""
    from types import SimpleNamespace

    import torch
    from onnx import TensorProto, helper

    from edgex.exporters.qdq_scheme import dequantized_constants, qdq_tensors
    from edgex.exporters.qnn_dlc import in_dlc
    from edgex.exporters.qnn_quantize import quantize_qdq
    from edgex.parity.quantized import score
    from edgex.qnn import htp_session
    from edgex.targets import get_target

    rng = np.random.default_rng(0)
    kernel = (rng.normal(size=(16, 8, 3, 3)) * 0.2 + rng.normal(size=(16, 1, 1, 1)) * 0.3).astype(np.float32)
    inits = [numpy_helper.from_array(kernel, "w"), numpy_helper.from_array(rng.normal(size=16).astype(np.float32), "b")]
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w", "b"], ["y"], name="conv", pads=[1, 1, 1, 1])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], inits)
    source, qdq, folder = tmp_path / "g.onnx", tmp_path / "q.onnx", tmp_path / "dlc"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    component = SimpleNamespace(name="g", inputs=[SimpleNamespace(name="x")], outputs=[], float_only=(),
                                calibration=lambda n: [(torch.randn(1, 8, 8, 8),) for _ in range(n)])
    quantize_qdq(source, qdq, component, precision, 2)
    folder.mkdir()
    options = get_target("s25-htp").exporter_options["qnn"]
    htp_session(qdq, soc_model=options["soc_model"], htp_arch=options["htp_arch"], fp16=True, dlc_dir=folder)
    (dlc,) = folder.glob("*.dlc")
    model, float_model = onnx.load(str(qdq)), onnx.load(str(source))
    _, _q, scale, zero, _axis = dequantized_constants(model)["w_quantized"]
    assert scale.size == 16 and set(np.asarray(zero).reshape(-1).tolist()) == {128 if precision == "w8a16" else 0}

    def checked(path):
        return {name: score(t) for name, t in in_dlc(path, model, qdq_tensors(model, float_model)).items()}

    good = checked(dlc)
    assert all(t["verdict"] == "pass" for t in good.values()) and good["w_quantized"]["agreement_db"] == np.inf, good
    channel = 5
    pair = np.float32(scale[channel]).tobytes() + (np.int32(-128).tobytes() if precision == "w8a16" else b"")
    bugs = {"scale x2": np.float32(scale[channel] * 2).tobytes() + pair[4:]}
    if precision == "w8a16":
        bugs["zero point +1"] = pair[:4] + np.int32(-129).tobytes()
    for bug, planted in bugs.items():
        data = dlc.read_bytes()
        assert data.count(pair) == 1, bug
        broken = tmp_path / f"{bug}.dlc"
        broken.write_bytes(data.replace(pair, planted))
        bad = checked(broken)
        assert [n for n, t in bad.items() if t["verdict"] == "fail"] == ["w_quantized"], (bug, bad)
        assert "scales / zero points not found in the .dlc" in bad["w_quantized"]["error"]


def test_dlc_constants_qnn_takes_another_way_are_listed_unread_and_a_changed_weight_still_fails(tmp_path):
    """Two kinds of QDQ constant the `.dlc` holds no copy of: Pad's scalar constant value (QNN's Pad
    takes it as a `pad_constant_value` parameter) and an all-zero bias (InstanceNormalization's, as a
    GroupNorm lowers to), which QAIRT may merge with other zero constants under its own encoding.
    Each is listed as not read back (the block is unverified, never a pass); the Conv kernel is
    still read back and, with one channel's scale doubled in the written file, fails. A scalar read by
    an op that takes it as a tensor is not exempt, nor is a constant with a non-zero integer."""
    from types import SimpleNamespace

    import torch
    from onnx import TensorProto, helper

    from edgex.exporters.qdq_scheme import dequantized_constants, qdq_tensors
    from edgex.exporters.qnn_dlc import _only_zero_points, _scalar_parameters, in_dlc
    from edgex.exporters.qnn_quantize import quantize_qdq
    from edgex.parity.quantized import QuantizedTensor, quantized_parity, score
    from edgex.qnn import htp_session
    from edgex.targets import get_target

    rng = np.random.default_rng(1)
    kernel = (rng.normal(size=(16, 8, 3, 3)) * 0.2).astype(np.float32)
    inits = [numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads"),
             numpy_helper.from_array(np.array(0.0, np.float32), "pad_value"),
             numpy_helper.from_array(np.ones(8, np.float32), "norm_scale"),
             numpy_helper.from_array(np.zeros(8, np.float32), "norm_bias"),
             numpy_helper.from_array(kernel, "w"), numpy_helper.from_array(rng.normal(size=16).astype(np.float32), "b")]
    nodes = [helper.make_node("Pad", ["x", "pads", "pad_value"], ["padded"], name="pad", mode="constant"),
             helper.make_node("InstanceNormalization", ["padded", "norm_scale", "norm_bias"], ["normed"], name="norm"),
             helper.make_node("Conv", ["normed", "w", "b"], ["y"], name="conv")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])], inits)
    source, qdq, folder = tmp_path / "g.onnx", tmp_path / "q.onnx", tmp_path / "dlc"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(source))
    component = SimpleNamespace(name="g", inputs=[SimpleNamespace(name="x")], outputs=[], float_only=(),
                                calibration=lambda n: [(torch.randn(1, 8, 8, 8),) for _ in range(n)])
    quantize_qdq(source, qdq, component, "w8a16", 2)
    folder.mkdir()
    options = get_target("s25-htp").exporter_options["qnn"]
    htp_session(qdq, soc_model=options["soc_model"], htp_arch=options["htp_arch"], fp16=True, dlc_dir=folder)
    (dlc,) = folder.glob("*.dlc")
    model, float_model = onnx.load(str(qdq)), onnx.load(str(source))
    constants = dequantized_constants(model)
    pad_value = next(n for n in constants if n.startswith("pad_value"))
    assert _scalar_parameters(model.graph) == {pad_value: "Pad"}

    def checked(path):
        return {name: score(t) for name, t in in_dlc(path, model, qdq_tensors(model, float_model)).items()}

    good = checked(dlc)
    assert good[pad_value]["verdict"] == "unverified" and "scalar parameter" in good[pad_value]["unverified"], good
    assert good["w_quantized"]["verdict"] == "pass" and good["w_quantized"]["agreement_db"] == np.inf
    assert all(t["verdict"] in ("pass", "unverified") for t in good.values()), good
    assert all(t["verdict"] == "pass" for n, t in good.items() if not _only_zero_points(constants[n][1], constants[n][3], constants[n][4])
               and n != pad_value), good
    exporter = SimpleNamespace(stored_quantized=lambda *_a, **_k: in_dlc(dlc, model, qdq_tensors(model, float_model)))
    block = quantized_parity(exporter, component, [dlc], "w8a16")
    assert block["verdict"] == "unverified" and pad_value in block["unverified"] and not block["failures"], block

    _, _q, scale, _zero, _axis = constants["w_quantized"]
    pair = np.float32(scale[5]).tobytes() + np.int32(-128).tobytes()
    data = dlc.read_bytes()
    assert data.count(pair) == 1
    broken = tmp_path / "scale x2.dlc"
    broken.write_bytes(data.replace(pair, np.float32(scale[5] * 2).tobytes() + pair[4:]))
    bad = checked(broken)
    assert [n for n, t in bad.items() if t["verdict"] == "fail"] == ["w_quantized"], bad

    # the exemptions are narrow: a scalar a Mul reads as a tensor is no parameter; a non-zero integer is no zero constant
    mul = helper.make_graph([helper.make_node("DequantizeLinear", ["s_q", "s_scale"], ["s"]),
                             helper.make_node("Pad", ["x", "pads", "s"], ["p"]), helper.make_node("Mul", ["p", "s"], ["y"])],
                            "m", [], [], [numpy_helper.from_array(np.array(3, np.uint8), "s_q"),
                                          numpy_helper.from_array(np.array(0.5, np.float32), "s_scale")])
    assert _scalar_parameters(mul) == {}
    assert _only_zero_points(np.array([128, 128, 128], np.uint8), np.array(128, np.uint8), 0)
    assert not _only_zero_points(np.array([128, 129, 128], np.uint8), np.array(128, np.uint8), 0)
    assert not _only_zero_points(np.array([[0, 0], [0, 1]], np.int32), np.zeros(2, np.int32), 0)
    assert isinstance(QuantizedTensor(np.zeros(1), np.zeros(1), None, unread="x").unread, str)


def _qnn_export_of(graph, tmp_path, monkeypatch):
    """The qnn exporter's fp16 build of a hand-made fp32 ONNX `graph` (standing for a component's
    graph), on the s25-htp options: (exporter, the component it was built for, the ExportResult)."""
    import tempfile
    from types import SimpleNamespace

    import torch

    import edgex.exporters.qnn as qnn
    import edgex.exporters.qnn_graphs as qnn_graphs
    from edgex.exporters import EXPORTERS
    from edgex.targets import get_target

    def write(_self, _component, _precision, dest, **_kwargs):
        onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), str(dest))

    class Component:  # what the exporter and its graph store read of one
        name, module, calibration_size, tables = "g", torch.nn.Linear(2, 2), 2, {}
        inputs = outputs = [SimpleNamespace(to_json=lambda: {"name": "x"})]

        def computed(self):  # nothing eager is computed for a hand-made graph
            return {}

        def added_since(self, _before):
            return {}

        def adopt(self, _added):
            pass

    component = Component()
    monkeypatch.setattr(qnn_graphs.OnnxExporter, "graph", write)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the graph store's folder, removed with tmp_path
    fresh = qnn_graphs.Graphs()
    monkeypatch.setattr(qnn, "GRAPHS", fresh)
    (tmp_path / "out").mkdir()
    exporter = EXPORTERS.get("qnn")
    result = exporter.export(component, "fp16", tmp_path / "out" / "g.fp16.qnn.onnx", **get_target("s25-htp").exporter_options["qnn"])
    return exporter, component, result


def test_an_fp16_dlc_stores_each_weight_once_in_fp16_and_one_changed_weight_fails(tmp_path, monkeypatch):
    """An fp16 `.dlc` holds the fp16 weights the HTP runs, not the fp32 graph's, and a weight
    unrolled steps read is stored once, whether the steps read one initializer, copies of it (torch's
    export folds each step's transposed weight into an initializer of its own where it is small) or
    a Transpose of it each (where it is not): the conv kernel, the gather table and the steps'
    matrices are each found once in `model.params.bin` as the fp32 weight rounded to fp16, never in
    fp32, and the `.dlc` is no larger than the runnable files.
    The stored-tensor check reads them back as fp16 (the rounding's SNR, ~74 dB); one element of the
    steps' matrix one fp16 step off in the written file fails it (each step's copy) and nothing else."""
    from onnx import TensorProto, helper

    from edgex.exporters.qnn_dlc import dlc_members
    from edgex.parity.tensors import tensor_parity

    rng = np.random.default_rng(0)
    weights = {"kernel": rng.normal(size=(16, 8, 3, 3)).astype(np.float32) * 0.2, "table": rng.normal(size=(32, 128)).astype(np.float32),
               "shared": rng.normal(size=(128, 128)).astype(np.float32) * 0.1, "norm": np.ones((128,), np.float32),
               "unfolded": rng.normal(size=(128, 128)).astype(np.float32) * 0.1}
    nodes = [helper.make_node("Conv", ["x", "kernel"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["c2"]),
             helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("Add", ["c2", "e"], ["h0"])]
    # an unrolled loop: the steps read one matrix, a copy of it, or (as torch's export leaves a weight
    # of more than 8192 elements that several steps read) a Transpose of one weight at each step
    nodes += [helper.make_node("Transpose", ["unfolded"], [f"unfolded.T{step}"], perm=[1, 0]) for step in (3, 4)]
    steps = ["shared", "shared", "shared.copy", "unfolded.T3", "unfolded.T4"]
    for step, matrix in enumerate(steps):
        nodes += [helper.make_node("MatMul", [f"h{step}", matrix], [f"m{step}"]),
                  helper.make_node("Mul", [f"m{step}", "norm"], [f"n{step}"]),
                  helper.make_node("Tanh", [f"n{step}"], [f"h{step + 1}"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4]),
                                           helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 2])],
                              [helper.make_tensor_value_info("h5", TensorProto.FLOAT, [1, 2, 128])],
                              [numpy_helper.from_array(a, n) for n, a in weights.items()]
                              + [numpy_helper.from_array(weights["shared"], "shared.copy"),
                                 numpy_helper.from_array(np.array([1, 2, 128], np.int64), "shape")])
    exporter, component, result = _qnn_export_of(graph, tmp_path, monkeypatch)
    (sidecar,) = result.sidecars
    (dlc,) = sidecar.files
    assert dlc.stat().st_size <= sum(f.stat().st_size for f in result.files)
    data = dlc_members(dlc)["model.params.bin"]
    for name in ("kernel", "table", "shared", "unfolded"):
        w = weights[name]
        assert data.count(w.astype(np.float16).tobytes()) == 1 and data.count(w.tobytes()) == 0, name
    good = tensor_parity(exporter, component, [dlc], 30.0, "fp16")
    assert good["verdict"] == "pass", good
    for name in ("kernel", "table", "shared", "shared.copy", "unfolded"):
        assert good["tensors"][name]["type"] == "float16 in model.params.bin" and 70 < good["tensors"][name]["snr_db"] < 80
    assert good["tensors"]["norm"] == {"type": "float32 in model.params.bin", "shape": [128], "snr_db": np.inf}

    half = weights["shared"].astype(np.float16)
    changed = half.copy()
    changed[3, 5] = np.nextafter(changed[3, 5], np.float16(np.inf))  # one element, one fp16 step
    broken = tmp_path / "changed.dlc"
    broken.write_bytes(dlc.read_bytes().replace(half.tobytes(), changed.tobytes()))
    bad = tensor_parity(exporter, component, [broken], 30.0, "fp16")
    assert bad["verdict"] == "fail" and [n for n, t in bad["tensors"].items() if t["snr_db"] < 30] == ["shared", "shared.copy"], bad
    assert bad["tensors"]["shared"]["error"] == "missing from the file"

