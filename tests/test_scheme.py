"""Scheme references (edgex.parity.scheme): stored weights land on the right reference parameters,
activation fake quantization is what it claims, and everything is restored afterwards."""

import pytest
import torch
from torch import nn

from edgex.component import Component, TensorSpec
from edgex.parity.scheme import BLOCKWISE, DYNAMIC, STATIC, ActivationQuant, StoredScheme, StoredWeight, build


class _Eager(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.heads = nn.ModuleList([nn.Linear(16, 4, bias=False) for _ in range(2)])


class _Wrapper(nn.Module):
    """Like the recipes' graphs: shares the eager modules, plus a derived (cloned) stack of heads."""

    def __init__(self, eager: _Eager):
        super().__init__()
        self.up = eager.up
        self.heads = eager.heads  # held but unused by the graph, which reads the stack
        self.register_buffer("stacked", torch.stack([h.weight for h in eager.heads]).clone(), persistent=False)


def _component():
    torch.manual_seed(0)
    eager = _Eager()

    def reference(x):
        h = eager.up(x)
        return (eager.heads[0](h), eager.heads[1](h))

    x = torch.randn(1, 3, 8)
    specs = [TensorSpec("a", (1, 3, 4), "float32"), TensorSpec("b", (1, 3, 4), "float32")]
    return eager, Component("toy", "test", _Wrapper(eager), [TensorSpec("x", (1, 3, 8), "float32")], specs, reference,
                            {"s": (x,)})


def test_stored_weights_replace_the_matching_rows_and_are_restored():
    eager, comp = _component()
    before = [p.detach().clone() for p in eager.parameters()]
    up = torch.round(comp.module.up.weight * 4) / 4
    stacked = comp.module.stacked + 0.5
    # the MatMul weight stored transposed ([in, out]), the derived stack under its own name
    scheme = StoredScheme("test", {"up_t": StoredWeight(comp.module.up.weight.t(), up.t()),
                                   "stacked": StoredWeight(comp.module.stacked, stacked)})
    ref = build(comp, scheme)
    (x,) = comp.samples["s"]
    a, b = ref((x,))
    h = nn.functional.linear(x, up, eager.up.bias)
    torch.testing.assert_close(a, h @ stacked[0].t(), rtol=0, atol=1e-6)
    torch.testing.assert_close(b, h @ stacked[1].t(), rtol=0, atol=1e-6)
    assert ref.coverage["unmatched"] == {}
    assert set(ref.coverage["parameters_swapped"]) == {"up.weight", "heads.0.weight", "heads.1.weight"}
    for p, saved in zip(eager.parameters(), before):
        assert torch.equal(p, saved)


def test_weights_that_stand_for_whole_parameters_swap_directly_as_the_row_search_would(monkeypatch):
    """fp16 rounding and torchao store each weight under its parameter's name, as the parameter's own
    tensor; a file's weights read back are copies of the values (here one stored transposed): all of
    those swap in directly (no index of every row's bytes, several copies of a model's weights),
    with the same values and coverage the row search gives for them."""
    from edgex.parity import scheme
    from edgex.parity.scheme import _viewed_parameters, rounded_to_fp16

    eager, comp = _component()
    direct = rounded_to_fp16(comp)
    copies = StoredScheme("test", {n: StoredWeight(w.original.clone(), w.stored) for n, w in direct.weights.items()}
                          | {"up_t": StoredWeight(direct.weights["up.weight"].original.t().clone(),
                                                  direct.weights["up.weight"].stored.t().clone())})
    del copies.weights["up.weight"]
    assert len(_viewed_parameters(comp, direct.weights)) == len(direct.weights)
    assert {n: v[0] for n, v in _viewed_parameters(comp, copies.weights).items()} == {
        "up_t": "up.weight", "up.bias": "up.bias", "heads.0.weight": "heads.0.weight", "heads.1.weight": "heads.1.weight"}
    fast, copied = build(comp, direct), build(comp, copies)
    monkeypatch.setattr(scheme, "_viewed_parameters", lambda *_: {})
    slow = build(comp, copies)
    assert fast.coverage["parameters_swapped"] == copied.coverage["parameters_swapped"] == slow.coverage["parameters_swapped"]
    assert fast.coverage["parameters_swapped"]["up.weight"] == "16/16 rows"
    (x,) = comp.samples["s"]
    for a, b, c in zip(fast((x,)), copied((x,)), slow((x,))):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert not torch.equal(fast((x,))[0], comp.reference(x)[0])  # the rounded weights were in place
    assert all(torch.equal(p, w.original) for p, w in zip(eager.parameters(), direct.weights.values()))  # and restored


def test_a_stored_view_of_a_parameter_maps_by_position_though_its_short_rows_repeat_elsewhere():
    """A 1x1 convolution's rows are single values, and at a real size many values occur in more than
    one tensor: each stored kernel (the parameter itself, under the file's own name) must take its
    own stored values, not those of the first tensor that holds the same number."""
    torch.manual_seed(0)
    first, second = nn.Conv1d(4, 4, 1, bias=False), nn.Conv1d(4, 4, 1, bias=False)
    with torch.no_grad():
        second.weight[0, 0, 0] = first.weight[1, 2, 0]  # one value in both kernels
    module = nn.Sequential(first, second)
    x = torch.randn(1, 4, 3)
    comp = Component("convs", "test", module, [TensorSpec("x", (1, 4, 3), "float32")],
                     [TensorSpec("y", (1, 4, 3), "float32")], lambda t: (module(t),), {"s": (x,)})
    coarse, fine = (lambda w: torch.round(w * 2) / 2), (lambda w: torch.round(w * 64) / 64)
    scheme = StoredScheme("test", {"p_first": StoredWeight(first.weight.detach(), coarse(first.weight.detach())),
                                   "p_second_t": StoredWeight(second.weight.detach().transpose(0, 1),
                                                              fine(second.weight.detach()).transpose(0, 1))})
    ref = build(comp, scheme)
    with ref.applied():
        swapped = {id(p): p.detach().clone() for p in module.parameters()}
    assert torch.equal(swapped[id(first.weight)], coarse(first.weight.detach()))
    assert torch.equal(swapped[id(second.weight)], fine(second.weight.detach()))
    assert ref.coverage["parameters_swapped"] == {"0.weight": "16/16 rows", "1.weight": "16/16 rows"}
    assert ref.coverage["unmatched"] == {}
    # the same kernels read back from a file: copies of their values, the second one's laid out [in, out]
    copies = StoredScheme("test", {n: StoredWeight(w.original.clone(), w.stored.clone()) for n, w in scheme.weights.items()})
    with build(comp, copies).applied():
        copied = {id(p): p.detach().clone() for p in module.parameters()}
    assert all(torch.equal(copied[k], v) for k, v in swapped.items())


def test_rows_that_belong_to_no_parameter_are_reported_not_guessed():
    _, comp = _component()
    folded = torch.cat((comp.module.up.weight, torch.randn(3, 8)))  # e.g. a table folded through another layer
    scheme = StoredScheme("test", {"table": StoredWeight(folded, folded + 0.25)})
    ref = build(comp, scheme)
    assert ref.coverage["unmatched"] == {"table": "3 of 19 rows match no reference parameter"}
    assert ref.coverage["parameters_swapped"] == {"up.weight": "16/16 rows"}


def test_activation_hook_quantizes_the_layer_input_and_is_removed():
    eager, comp = _component()
    quant = ActivationQuant(STATIC, bits=8, signed=False, scale=0.5, zero_point=128)
    ref = build(comp, StoredScheme("test", {}, {"up": quant}))
    (x,) = comp.samples["s"]
    a, _ = ref((x,))
    expected = eager.heads[0](eager.up(torch.clamp(torch.round(x / 0.5) + 128, 0, 255).sub(128) * 0.5))
    torch.testing.assert_close(a, expected, rtol=0, atol=1e-6)
    assert not eager.up._forward_pre_hooks
    assert not torch.equal(comp.reference(x)[0], a)


def test_dynamic_per_token_int8_keeps_zero_and_stays_within_half_a_step():
    x = torch.randn(4, 64) * torch.tensor([[0.01], [1.0], [100.0], [3.0]])
    x[:, 0] = 0
    y = ActivationQuant(DYNAMIC, bits=8)(x)
    assert torch.all(y[:, 0] == 0)
    step = (x.amax(-1).clamp(min=0) - x.amin(-1).clamp(max=0)) / 255
    assert torch.all((y - x).abs() <= step[:, None] * 0.5 + 1e-6)
    assert len(torch.unique(y[1])) <= 256


def test_a_stored_weight_must_keep_its_shape():
    _, comp = _component()
    with pytest.raises(ValueError, match="shape"):
        build(comp, StoredScheme("test", {"w": StoredWeight(comp.module.up.weight, comp.module.up.weight.t())}))


@pytest.fixture(scope="module")
def talker_decode():
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    (component,) = recipe.components(recipe.load("tiny", None, 0), ["talker_decode"])
    return component


def _gguf_parity(component, tmp_path, layout):
    from edgex.export import run_parity
    from edgex.exporters import EXPORTERS

    exporter = EXPORTERS.get("gguf")
    component.layouts = {"gguf": layout}
    files = exporter.export(component, "q4_0", tmp_path / "talker_decode.q4_0.gguf").files
    return run_parity(component, exporter, files, "float32", "q4_0", None, 1)


def test_a_broken_lowering_fails_where_the_end_to_end_gate_would_pass(talker_decode, tmp_path):
    """A lowering bug (the file tells llama.cpp a RoPE base 40 % off) under a noisy 4-bit scheme:
    end to end it still clears the q4_0 gate that used to be the only one; against the eager model
    running the file's own q4_0 weights it fails, while the scheme figure is unchanged."""
    import dataclasses

    from edgex.parity.gates import DEFAULT_DB, LOWERING_DB

    layout = talker_decode.layouts["gguf"]
    good = _gguf_parity(talker_decode, tmp_path, layout)
    assert good.verdict == "pass" and good.lowering["min_snr_db"] >= LOWERING_DB["q4_0"] + 10
    key = "qwen3tts.rope.freq_base"
    broken = dataclasses.replace(layout, metadata={**layout.metadata, key: layout.metadata[key] * 1.4})
    try:
        report = _gguf_parity(talker_decode, tmp_path, broken)
    finally:
        talker_decode.layouts = {"gguf": layout}
    assert report.min_snr_db >= DEFAULT_DB["q4_0"]  # the old single figure passes
    assert report.scheme["verdict"] == "pass" and abs(report.scheme["min_snr_db"] - good.scheme["min_snr_db"]) < 1e-6
    assert report.lowering["verdict"] == "fail" and report.lowering["min_snr_db"] < LOWERING_DB["q4_0"]
    assert report.verdict == "fail" and all(f.startswith("lowering: ") for f in report.failures)


def test_blockwise_int8_is_symmetric_per_block_and_keeps_zero():
    """MatMulNBits' accuracy_level 4 activations: codes round(x * 127 / absmax) per block."""
    x = torch.randn(3, 64) * torch.tensor([[0.01], [1.0], [100.0]])
    x[:, 5] = 0
    y = ActivationQuant(BLOCKWISE, bits=8, block=32)(x)
    assert torch.all(y[:, 5] == 0)
    scale = x.reshape(3, 2, 32).abs().amax(-1, keepdim=True) / 127
    codes = y.reshape(3, 2, 32) / scale
    torch.testing.assert_close(codes, torch.round(codes), rtol=0, atol=1e-3)
    assert codes.abs().max() <= 127 + 1e-3
    assert torch.all((y - x).reshape(3, 2, 32).abs() <= scale * 0.5 + 1e-6)


def test_matmul_nbits_artifact_is_read_back_and_a_broken_one_fails(talker_decode, tmp_path):
    """ONNX 8da4w (MatMulNBits int4 blocks, int8 activations): the scheme reference built from the
    file's weights and MLAS's activation quantization reproduces ONNX Runtime to rounding, and a
    file whose int4 codes are packed in the wrong nibble order (the classic packing bug), or whose
    zero points were lost, fails."""
    import onnx
    from onnx import numpy_helper

    from edgex.export import run_parity
    from edgex.exporters import EXPORTERS
    from edgex.parity.gates import DEFAULT_DB

    exporter = EXPORTERS.get("onnx")
    dest = tmp_path / "talker_decode.8da4w.onnx"
    before = {n: t.clone() for n, t in (*talker_decode.module.named_parameters(), *talker_decode.module.named_buffers())}
    result = exporter.export(talker_decode, "8da4w", dest)
    after = dict((*talker_decode.module.named_parameters(), *talker_decode.module.named_buffers()))
    assert all(torch.equal(t, after[n]) and t.dtype == after[n].dtype for n, t in before.items())  # exported in place, restored
    linears = {n for n, m in talker_decode.module.named_modules() if isinstance(m, nn.Linear)}
    assert result.details["quantized_weights"] == len(linears)
    good = run_parity(talker_decode, exporter, result.files, "float32", "8da4w", None, 1)
    assert good.verdict == "pass", good.failures
    assert good.lowering["min_snr_db"] >= 100  # the reference models the kernels, not just the weights
    assert good.scheme["min_snr_db"] < 40 and good.scheme["coverage"]["unmatched"] == {}
    assert len(good.scheme["activations"]) == len(linears)

    assert result.details["symmetric"] is False  # int4 blocks carry zero points, read back too
    pristine = onnx.load(str(dest))
    nibbles_swapped = lambda packed: ((packed & 0x0F) << 4) | (packed >> 4)  # noqa: E731
    for broken_tensor, breaking in (("edgex.linear.codec_head_Q4", nibbles_swapped),
                                    ("edgex.linear.codec_head_zero_point", lambda packed: packed * 0)):  # zero points lost
        model = onnx.ModelProto()
        model.CopyFrom(pristine)
        head = next(i for i in model.graph.initializer if i.name.startswith(broken_tensor))
        head.CopyFrom(numpy_helper.from_array(breaking(numpy_helper.to_array(head)), head.name))
        (tmp_path / (dest.name + ".data")).unlink()
        onnx.save(model, str(dest), save_as_external_data=True, all_tensors_to_one_file=True, location=dest.name + ".data")
        broken = run_parity(talker_decode, exporter, result.files, "float32", "8da4w", None, 1)
        assert broken.verdict == "fail", broken_tensor
        assert broken.scheme["min_snr_db"] < DEFAULT_DB["8da4w"] < good.scheme["min_snr_db"], broken_tensor


class _Reused(nn.Module):
    """One linear layer called twice, too large for onnxscript to fold its weight's Transpose (more
    than 8192 values with two consumers): the shape of every layer of the unrolled predictor frame."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(128, 128, bias=False)

    def forward(self, x):
        return self.layer(torch.tanh(self.layer(x)))


def test_matmul_nbits_quantizes_a_layer_the_graph_calls_twice(tmp_path):
    """The fp32 graph reads such a weight through a shared Transpose; the exporter folds it so both
    MatMuls become MatMulNBits on one int4 copy, and no fp32 copy of the weight stays in the file."""
    import onnx

    from edgex.export import run_parity
    from edgex.exporters import EXPORTERS

    torch.manual_seed(0)
    module = _Reused()
    spec = [TensorSpec("x", (1, 1, 128), "float32")]
    comp = Component("reused", "test", module, spec, [TensorSpec("y", (1, 1, 128), "float32")],
                     lambda x: (module(x),), {"a": (torch.randn(1, 1, 128),), "b": (torch.randn(1, 1, 128),)})
    exporter = EXPORTERS.get("onnx")
    result = exporter.export(comp, "8da4w", tmp_path / "reused.8da4w.onnx")
    assert (result.details["quantized_matmuls"], result.details["quantized_weights"], result.details["float_matmuls"]) == (2, 1, 0)
    graph = onnx.load(str(result.files[0])).graph
    assert [n.op_type for n in graph.node].count("MatMulNBits") == 2
    assert not any(i.data_type == onnx.TensorProto.FLOAT and list(i.dims) == [128, 128] for i in graph.initializer)
    report = run_parity(comp, exporter, result.files, "float32", "8da4w", None, 1)
    assert report.verdict == "pass", report.failures
    assert report.lowering["min_snr_db"] >= 100 and report.scheme["coverage"]["unmatched"] == {}


def test_the_artifacts_runtime_is_released_before_its_scheme_reference_is_built(talker_decode, tmp_path, monkeypatch):
    """The fp16 ONNX artifact runs once, its outputs kept; ONNX Runtime's session is gone when the
    scheme reference's weights are made, and the verdict is the one the replayed outputs give."""
    import gc
    import weakref

    from edgex.export import run_parity
    from edgex.exporters import EXPORTERS
    from edgex.parity.runtimes import RUNTIMES
    from edgex.parity.scheme import Recording

    exporter = EXPORTERS.get("onnx")
    files = exporter.export(talker_decode, "fp16", tmp_path / "talker_decode.fp16.onnx").files
    runtime = RUNTIMES.get(exporter.runtime)
    sessions, alive_when_built = [], []
    load, reference = runtime.load, exporter.scheme_reference

    def tracked_load(*args, **kwargs):
        session = load(*args, **kwargs)
        sessions.append(weakref.ref(session))
        return session

    def tracked_reference(*args, **kwargs):
        gc.collect()
        alive_when_built.append([ref() is not None for ref in sessions])
        return reference(*args, **kwargs)

    monkeypatch.setattr(runtime, "load", tracked_load)
    monkeypatch.setattr(exporter, "scheme_reference", tracked_reference)
    report = run_parity(talker_decode, exporter, files, "float16", "fp16", None, 1)
    assert report.verdict == "pass", report.failures
    assert alive_when_built == [[False]] and report.lowering["verdict"] == "pass"

    recording = Recording(load(files, 1))
    recording.release()
    with pytest.raises(RuntimeError, match="released"):
        recording.run([])
    with pytest.raises(RuntimeError, match="more calls"):
        recording.replay().run([])


def test_the_scheme_pass_reuses_the_lowering_pass_reference_outputs_and_a_broken_artifact_still_fails():
    """The scheme reference runs once per sample for both of `measure_split`'s passes that need it
    (and for a re-gate); the figures are those of a reference run for each pass, and an artifact
    that computes something else fails its lowering gate."""
    import numpy as np

    from edgex.parity.runtimes.base import Session
    from edgex.parity.scheme import measure_split, remembered

    eager, comp = _component()
    comp.samples["t"] = (torch.randn(1, 3, 8),)
    up = torch.round(comp.module.up.weight * 64) / 64
    reference = build(comp, StoredScheme("test", {"up": StoredWeight(comp.module.up.weight, up)}))
    calls = []

    def counted(inputs, forced_tokens=None):
        calls.append(forced_tokens)
        return reference(inputs, forced_tokens)

    class _Counted:
        label = reference.label
        to_json = reference.to_json
        __call__ = staticmethod(counted)

    class _Artifact(Session):
        def __init__(self, offset):
            self.offset = offset

        def run(self, inputs):
            return [t.numpy() + self.offset for t in reference((torch.from_numpy(inputs[0]),))]

    kept = remembered(_Counted())
    faithful = measure_split(comp, _Artifact(0.0), "test", "float32", 20.0, 60.0, kept)
    assert len(calls) == 2, calls  # one run per sample, both passes
    again = measure_split(comp, _Artifact(0.0), "test", "float32", 20.0, 60.0, kept)
    assert len(calls) == 2 and again.scheme["min_snr_db"] == faithful.scheme["min_snr_db"]
    fresh = measure_split(comp, _Artifact(0.0), "test", "float32", 20.0, 60.0, reference)
    assert fresh.scheme["min_snr_db"] == faithful.scheme["min_snr_db"] and faithful.verdict == "pass"
    assert faithful.lowering["verdict"] == "pass"
    broken = measure_split(comp, _Artifact(0.05), "test", "float32", 20.0, 60.0, kept)
    assert broken.lowering["verdict"] == "fail" and broken.verdict == "fail"
    assert broken.scheme["min_snr_db"] == faithful.scheme["min_snr_db"]
    # a session fed other values than the samples' gets a run of its own, never a kept output
    other = np.zeros((1, 3, 8), np.float32)
    assert kept.kept_for([other]) is None and kept.kept_for([comp.samples["s"][0].numpy()]) is not None


@pytest.mark.parametrize("hashing", ["own", "colliding"])
def test_rows_are_found_again_at_their_first_occurrence_by_value(hashing, monkeypatch):
    # The scheme reference maps each stored row onto a parameter row of the same values; the index
    # it looks them up in must give what a dict of each row's bytes gave (the first table and row
    # holding those values), whatever the hashes: with every hash equal, only the values decide.
    import numpy as np
    import torch

    from edgex.parity import scheme

    if hashing == "colliding":
        monkeypatch.setattr(scheme, "_row_hash", lambda rows: np.zeros(len(rows), np.uint64))
    rng = np.random.default_rng(5)
    first = torch.from_numpy(rng.standard_normal((6, 5)).astype(np.float32))
    second = torch.cat([first[2:4], torch.from_numpy(rng.standard_normal((3, 5)).astype(np.float32))])  # rows 0, 1 repeat first's 2, 3
    wide = torch.from_numpy(rng.standard_normal((2, 7)).astype(np.float32))
    index = scheme._RowIndex([first, second, wide])
    query = torch.stack([second[3], first[3], torch.zeros(5), second[4], first[0]])
    expected = {}
    for i, row in enumerate(query.numpy()):
        for t, table in enumerate([first, second]):
            matches = [j for j, r in enumerate(table.numpy()) if r.tobytes() == row.tobytes()]
            if matches:
                expected.setdefault(t, ([], []))
                expected[t][0].append(i)
                expected[t][1].append(matches[0])
                break
    got = index.find(query)
    assert {t: (a.tolist(), r.tolist()) for t, (a, r) in got.items()} == expected == {1: ([0, 3], [3, 4]), 0: ([1, 4], [3, 0])}
    assert {t: (a.tolist(), r.tolist()) for t, (a, r) in index.find(wide).items()} == {2: ([0, 1], [0, 1])}


def test_tables_made_of_parameter_rows_are_told_from_tables_computed_otherwise():
    """What a weight-only scheme may compress: a stack of parameter rows (either orientation) is
    weights; a RoPE-like table is not, though its first row (cos 0 = ones) equals a norm's weight."""
    from edgex.nn.transformer import rope_table
    from edgex.parity.scheme import made_of_parameter_rows

    torch.manual_seed(0)
    module = nn.ModuleDict({"embed": nn.Embedding(6, 8), "norm": nn.LayerNorm(8)})
    cos, _ = rope_table(torch.rand(4), 5)
    tables = {"stacked": module["embed"].weight.detach()[[4, 0, 2]].clone(),
              "transposed": module["embed"].weight.detach()[:3].t().clone(),
              "rope": cos, "one_row_off": torch.cat((module["embed"].weight.detach()[:2], torch.randn(1, 8)))}
    assert torch.equal(cos[0], module["norm"].weight.detach())
    assert made_of_parameter_rows(module, tables) == {"stacked", "transposed"}
