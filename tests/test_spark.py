"""Recipe spark-x2.5 (tiny preset, window 16): the graphs equal the eager reference, a runner
over them reproduces a full-sequence forward across several sliding windows, exported graphs
generate the reference's greedy tokens, quantized schemes keep the head gate in float, and
checkpoints load with the published names."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from conftest import cli_here, run_cli
from edgex.catalog import catalog
from edgex.errors import EdgexError
from edgex.exporters.onnx import OnnxExporter
from edgex.parity.metrics import snr_db, token_agreement
from edgex.parity.runtimes import RUNTIMES
from edgex.recipes import RECIPES
from edgex.recipes.base import parse_settings
from edgex.recipes.spark_x25.facts import ROLES
from edgex.recipes.spark_x25.checkpoint import load_checkpoint
from edgex.recipes.spark_x25.config import FULL, SLIDING, get_preset
from edgex.recipes.spark_x25 import model as reference_code
from edgex.recipes.spark_x25.graphs import SparkDecode, empty_state
from edgex.recipes.spark_x25.model import build
from edgex.recipes.spark_x25.reference import step_reference
from edgex.recipes.spark_x25.runner import CacheRunner, numpy_callable
from edgex.verify import verify_directory
from test_cli_errors import assert_one_line_error

pytestmark = pytest.mark.xdist_group("spark")  # its module fixture is built once


@pytest.fixture(scope="module")
def spark():
    recipe = RECIPES.get("spark-x2.5")
    loaded = recipe.load("tiny", None, 0)
    return loaded, {c.name: c for c in recipe.components(loaded)}


def test_tiny_keeps_the_published_structure():
    config = get_preset("tiny").config
    assert config.layer_types == (SLIDING, SLIDING, SLIDING, FULL)
    assert config.sliding_window == 16 and config.vocab_size == 131072
    assert get_preset("1.7b").config.layer_types.count(FULL) == 7  # 3:1 over 28 layers


@pytest.mark.parametrize("name", list(ROLES))
def test_wrapper_equals_reference(spark, name):
    _, components = spark
    comp = components[name]
    assert len(comp.samples) >= 2
    for sample, inputs in comp.samples.items():
        with torch.no_grad():
            got = comp.module(*inputs)
        for spec, ref, out in zip(comp.outputs, comp.reference_outputs(sample), got):
            assert tuple(out.shape) == spec.shape, (sample, spec.name)
            assert snr_db(ref.numpy(), out.numpy()) >= 100.0, (sample, spec.name)


# Bugs planted in the eager reference's own code. Module functions are broken through their code
# object, so every holder of the function (an import alias in the graphs included) would see it.
def _rope_turned_backwards(x, cos, sin):
    dims = cos.shape[-1]
    rot, rest = x[..., :dims], x[..., dims:]
    rotated = torch.cat((-rot[..., dims // 2 :], rot[..., : dims // 2]), dim=-1)
    return torch.cat((rot * cos - rotated * sin, rest), dim=-1)


def _full_layers_with_sliding_rope(config, layer_type):
    dims, theta = config.head_dim, config.sliding_rope_theta
    return 1.0 / theta ** (torch.arange(0, dims, 2, dtype=torch.float32) / dims)


def _tanh_gelu_mlp(self, x):
    return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


def _norm_without_weight(self, x):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)).to(x.dtype)


REFERENCE_BUGS = {
    "rope rotation": lambda mp: mp.setattr(reference_code.apply_partial_rope, "__code__", _rope_turned_backwards.__code__),
    "rope frequencies": lambda mp: mp.setattr(reference_code.rope_inv_freq, "__code__", _full_layers_with_sliding_rope.__code__),
    "mlp gelu": lambda mp: mp.setattr(reference_code.SparkMLP, "forward", _tanh_gelu_mlp),
    "rms norm": lambda mp: mp.setattr(reference_code.RMSNorm, "forward", _norm_without_weight),
}


@pytest.mark.parametrize("bug", list(REFERENCE_BUGS))
def test_graphs_share_no_numerical_code_with_the_reference(spark, monkeypatch, bug):
    """A bug planted in the eager reference's code leaves the graph's outputs bit-identical and
    drops graph-vs-reference parity far below the fp32 bar: the graph computes it all itself, so
    a bug in shared code cannot cancel out of the gate."""
    loaded, components = spark
    inputs = components["decode"].samples[f"prompt_a_pos{loaded.options['max_context'] - 1}_last_slot"]  # the ring has wrapped
    with torch.no_grad():
        clean = SparkDecode(build(loaded.models.config, 0), loaded.options["max_context"])(*inputs)
        REFERENCE_BUGS[bug](monkeypatch)
        broken = build(loaded.models.config, 0)  # inv_freq is computed when a model is built
        graph = SparkDecode(broken, loaded.options["max_context"])(*inputs)
    for before, after in zip(clean, graph):
        assert torch.equal(before, after), "the graph's numbers depend on the reference's code"
    reference = step_reference(broken, *inputs)
    # measured: rope rotation -1.9 dB, rope frequencies 18.7, rms norm 10.2, tanh gelu 70.6 (the
    # llama.cpp-sized gap: under the 100 dB wrapper bar of test_wrapper_equals_reference, not the 60 dB gate)
    assert snr_db(reference[0].numpy(), graph[0].numpy()) < 90.0, "the planted bug must show in the logits"


def test_decode_after_prefill_equals_full_forward_across_windows(spark):
    loaded, components = spark
    model, opts = loaded.models, loaded.options
    prompt = torch.randint(0, model.config.vocab_size, (1, 60), generator=torch.Generator().manual_seed(7))
    runner = CacheRunner(numpy_callable(components["prefill"].module), numpy_callable(components["decode"].module),
                         [t.numpy() for t in empty_state(model.config, opts["max_context"])], opts["prefill"])
    got = runner.feed(prompt[0].numpy())
    decoded = 60 - 2 * opts["prefill"]
    assert decoded > 2 * opts["window"], "the decode steps alone cross more than two sliding windows"
    assert snr_db(model(prompt)[0].numpy(), got) >= 100.0


def test_calibration_draws_held_out_eager_activations(spark):
    _, components = spark
    for comp in components.values():
        batches = comp.calibration(5)
        assert len(batches) == 5
        for inputs in batches:
            comp.check_inputs(inputs)
            for sample in comp.samples.values():
                assert not all(torch.equal(a, b) for a, b in zip(inputs, sample))
        assert len({int(b[1]) for b in batches}) >= 3, "several positions, not one state"
        assert any(float(b[2].abs().sum()) > 0 for b in batches), "real cache state, not zeros"


@pytest.mark.benchmark  # in the suite: edgex pipeline over the CLI's ONNX fp32 graphs (tests/test_sweep.py), same runner
def test_greedy_tokens_from_the_exported_graphs_match_the_reference(spark, tmp_path):
    loaded, components = spark
    model, opts = loaded.models, loaded.options
    sessions = {}
    for name in ROLES:
        files = OnnxExporter().export(components[name], "fp32", tmp_path / f"{name}.onnx").files
        sessions[name] = RUNTIMES.get("onnxruntime").load(files, 2)
    prompt = torch.randint(0, model.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(11))
    runner = CacheRunner(sessions["prefill"].run, sessions["decode"].run,
                         [t.numpy() for t in empty_state(model.config, opts["max_context"])], opts["prefill"])
    got = runner.greedy(prompt[0].numpy(), 64)
    want = model.greedy(prompt, 64)[0].numpy()
    assert len(set(want.tolist())) > 16, "the reference text varies, so agreement means something"
    assert token_agreement(want, got) == 1.0


def test_quantized_executorch_keeps_the_gate_in_float(spark):
    from edgex.exporters.executorch import prepare

    _, components = spark
    module, _ = prepare(components["decode"], "8da8w")
    layer = module.model.layers[0]
    assert type(layer.self_attn.g_proj.weight) in (torch.Tensor, torch.nn.Parameter)
    assert type(layer.self_attn.q_k_v_proj.weight) not in (torch.Tensor, torch.nn.Parameter)
    assert type(layer.mlp.down_proj.weight) not in (torch.Tensor, torch.nn.Parameter)


def test_mnn_target_with_a_max_context_option(tmp_path):
    proc = cli_here("export", "spark-x2.5", "--target", "mnn", "--preset", "tiny", "-c", "decode", "-p", "w8",
                   "--set", "max_context=48", "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["settings"] == {"max_context": "48"} and data["options"]["max_context"] == 48
    by_precision = {a["precision"]: a for a in data["artifacts"]}
    for a in by_precision.values():
        assert a["parity"]["method"] == "runtime" and a["verdict"] == "pass", a["parity"]
        assert {s["name"]: s["shape"] for s in a["inputs"]}["past_key"] == [1, 1, 2, 48, 32]
        assert a["metadata"]["max_context"] == 48 and a["metadata"]["window"] == 16
    assert "not honoured" in by_precision["w8"]["details"]["float_only"]
    # verify rebuilds the graphs with the recorded settings (max_context 48, not the preset's 128)
    assert verify_directory(tmp_path)["status"] == "pass"


def test_llama_cpp_target_runs_spark_in_llama_cpp_s_own_architecture(tmp_path):
    """llama.cpp knows Spark-X2.5 (`spark2_5`): the GGUF is its layout, run by libllama, the ring
    and the full layers' past seeding its two caches (the second sample starts after two wraps)."""
    from gguf import GGUFReader

    proc = cli_here("export", "spark-x2.5", "--target", "llama-cpp", "--preset", "tiny", "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    artifacts = json.loads(proc.stdout)["artifacts"]
    assert {(a["component"], a["precision"]) for a in artifacts} == {(c, p) for c in ROLES for p in ("f16", "q8_0")}
    for a in artifacts:
        parity = a["parity"]
        assert a["format"] == "gguf" and parity["method"] == "runtime" and parity["runtime"] == "llamacpp"
        assert a["verdict"] == "pass" and a["details"]["architecture"] == "spark2_5"
        for sample in parity["samples"].values():
            assert set(sample) == {"logits", "next_ring_key", "next_ring_value", "key", "value"}
    f16 = {a["component"]: a["parity"] for a in artifacts if a["precision"] == "f16"}
    assert "prompt_b_start36" in f16["prefill"]["samples"]
    assert min(p["min_snr_db"] for p in f16.values()) > 45  # tanh-GELU + F16 cache vs the exact fp32 reference
    q8 = next(a for a in artifacts if a["precision"] == "q8_0" and a["component"] == "decode")
    types = {t.name: t.tensor_type.name for t in GGUFReader(str(tmp_path / "spark-x2.5" / "llama-cpp" / q8["files"][0]["path"])).tensors}
    assert {t for n, t in types.items() if n.endswith("attn_gate.weight")} == {"F32"}  # the gate stays float
    assert types["blk.0.attn_qkv.weight"] == "Q8_0" and types["blk.0.ffn_down.weight"] == "Q8_0"


def test_llama_cpp_parity_catches_a_wrong_spark_layout(spark, tmp_path):
    """The sliding and full layers' RoPE bases swapped: llama.cpp loads and runs the file, the gate fails it."""
    from dataclasses import replace

    from edgex.export import run_parity
    from edgex.exporters import EXPORTERS

    comp = spark[1]["decode"]
    layout = comp.layouts["gguf"]
    meta = layout.metadata
    swapped = {**meta, "spark2_5.rope.freq_base": meta["spark2_5.rope.freq_base_swa"],
               "spark2_5.rope.freq_base_swa": meta["spark2_5.rope.freq_base"]}
    exporter = EXPORTERS.get("gguf")
    reports = {}
    for name, lay in (("right", layout), ("swapped", replace(layout, metadata=swapped))):
        variant = replace(comp, layouts={"gguf": lay}, _reference_outputs=comp._reference_outputs)
        result = exporter.export(variant, "f16", tmp_path / f"{name}.gguf")
        reports[name] = run_parity(variant, exporter, result.files, "float32", "f16", None, 2)
    assert reports["right"].verdict == "pass" and reports["swapped"].verdict == "fail"
    assert reports["swapped"].min_snr_db < reports["right"].min_snr_db - 20


@pytest.mark.parametrize("setting, fragment", [
    ("window=8", "unknown option 'window' for spark-x2.5 (known: max_context, prefill)"),
    ("max_context=lots", "bad value 'lots' for option max_context"),
    ("max_context=-4", "expected a positive integer"),
    ("context", "bad --set 'context': expected KEY=VALUE"),
])
def test_bad_options_are_refused(setting, fragment):
    with pytest.raises(EdgexError) as err:
        RECIPES.get("spark-x2.5").parse_options(parse_settings([setting]))
    assert fragment in str(err.value)


def test_unknown_option_is_a_one_line_cli_error_also_for_recipes_without_options(tmp_path):
    proc = run_cli("export", "act", "--set", "context=64", "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "unknown option 'context' for act (known: none)")


# -- checkpoints ---------------------------------------------------------------------------------
def _write_checkpoint(root, model, split_qkv=False, drop=None):
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["SparkForCausalLM"], **model.config.to_dict()}))
    state = {k: v.to(torch.bfloat16).contiguous() for k, v in model.state_dict().items() if k != drop}
    if split_qkv:
        cfg = model.config
        for name in [k for k in state if k.endswith("q_k_v_proj.weight")]:
            q, k, v = state.pop(name).split([cfg.num_attention_heads * cfg.head_dim] + [cfg.num_key_value_heads * cfg.head_dim] * 2)
            for part, tensor in zip("qkv", (q, k, v)):
                state[name.replace("q_k_v_proj", f"{part}_proj")] = tensor.contiguous()
    save_file(state, str(root / "model.safetensors"))
    return root


@pytest.mark.parametrize("split_qkv", [False, True])
def test_checkpoint_loads_published_names(tmp_path, split_qkv):
    model = build(get_preset("tiny").config, seed=3)
    assert "model.layers.0.self_attn.q_k_v_proj.weight" in model.state_dict()
    assert not any("lm_head" in k for k in model.state_dict())
    loaded = load_checkpoint(_write_checkpoint(tmp_path / "ckpt", model, split_qkv))
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor.to(torch.bfloat16).float()), name


def test_checkpoint_missing_tensor_is_refused(tmp_path):
    model = build(get_preset("tiny").config, seed=3)
    root = _write_checkpoint(tmp_path / "ckpt", model, drop="model.layers.1.self_attn.g_proj.weight")
    with pytest.raises(EdgexError, match="lacks 1 tensors, e.g. model.layers.1.self_attn.g_proj.weight"):
        load_checkpoint(root)


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text(json.dumps(get_preset("tiny").config.to_dict()))
    (root / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    proc = run_cli("export", "spark-x2.5", "--checkpoint", str(root), "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "corrupt safetensors file", "model.safetensors")
    assert not any(p.is_file() for p in (tmp_path / "o").rglob("*"))


def test_list_shows_presets_components_and_options():
    data = catalog()["models"]["spark-x2.5"]
    assert set(data["presets"]) == {"tiny", "1.7b"}
    assert data["components"] == {"prefill": "llm", "decode": "llm"}
    assert set(data["options"]) == {"max_context", "prefill"}


def test_samples_do_not_depend_on_which_components_are_derived_together():
    """`edgex verify` and the build cache derive one component at a time: a component's samples must
    be bit-identical whatever else was derived in the same call (the eager cache was once grown in
    the chunks earlier requests asked for, and differed in the last bits)."""
    recipe = RECIPES.get("spark-x2.5")
    alone = recipe.components(recipe.load("tiny", None, 0, {}), ["decode"])[0]
    together = {c.name: c for c in recipe.components(recipe.load("tiny", None, 0, {}), ["prefill", "decode"])}["decode"]
    assert list(alone.samples) == list(together.samples)
    for name in alone.samples:
        assert all(torch.equal(x, y) for x, y in zip(alone.samples[name], together.samples[name])), name


def test_fp16_graph_reads_exact_rope_tables_at_a_1k_context():
    """Rounded to fp16, RoPE frequencies put each angle off by up to position x 2^-12 of the
    frequency: the tiny decode graph at position ~1k scored 27.2 dB on its logits in eager fp16
    with them (the 1.7b graph: 5.7 dB; its fp16 `.pte` and ONNX failed their gate). The graph computes
    no angle: it gathers rows of cos / sin tables over its 1024 positions, computed in float64 and,
    lying in [-1, 1], stored in fp16 like every other buffer and parameter `module_in` casts."""
    from edgex.exporters.base import cast_inputs, module_in

    recipe = RECIPES.get("spark-x2.5")
    (comp,) = recipe.components(recipe.load("tiny", None, 0, {"max_context": 1024}), ["decode"])
    sample, inputs = next(iter(comp.samples.items()))
    with torch.no_grad(), module_in(comp, torch.float16) as module:
        assert module.rope_full_cos.dtype == module.rope_sliding_sin.dtype == torch.float16
        assert module.rope_full_cos.shape[0] == module.rope_sliding_cos.shape[0] == 1024
        assert module.model.layers[0].input_layernorm.weight.dtype == torch.float16
        logits = module(*cast_inputs(inputs, torch.float16))[0]
    assert module.rope_full_cos.dtype == torch.float32 and module.model.layers[0].input_layernorm.weight.dtype == torch.float32
    reference = comp.reference_outputs(sample)[0]
    assert snr_db(reference.numpy(), logits.float().numpy()) > 40


def test_fp16_pte_of_a_wide_model_passes_its_gate_on_small_activations_and_a_broken_one_fails(monkeypatch, tmp_path):
    """fp16 RMSNorm at hidden 1024 on an embedding row (RMS ~0.02) run by XNNPACK: squaring
    x / (16 sqrt(n)) underflowed every term, and the Spark-X2.5 1.7b decode `.pte` fp16 failed at
    4.6 dB. Scaling each row by its peak keeps the squares in [0, 1] at any scale
    (`nn.transformer.rms_norm`). Where XNNPACK sums fp16 products in fp16 (AVX512-FP16 hosts, phones),
    the faithful graph's own arithmetic holds it near 29 dB, under the fixed 30 dB fp16 gate: the
    gates then follow the component's floor there (`parity.half_arithmetic`), and the same graph with a
    dropped head still fails them. Elsewhere it scores above 40 dB."""
    from dataclasses import replace

    from edgex.export import run_parity
    from edgex.exporters import EXPORTERS
    from edgex.parity.gates import HALF_ARITHMETIC_MIN_DB
    from edgex.recipes.spark_x25 import config
    from planted_graph import plant

    tiny = config.PRESETS["tiny"]
    wide = replace(tiny, name="wide", config=config.SparkConfig(4096, 1024, 256, 4, 4, 2, 256, sliding_window=16))
    monkeypatch.setitem(config.PRESETS, "wide", wide)
    recipe = RECIPES.get("spark-x2.5")
    (comp,) = recipe.components(recipe.load("wide", None, 0), ["decode"])
    exporter = EXPORTERS.get("executorch")
    half = RUNTIMES.get("executorch").accumulates_in_half()
    result = exporter.export(comp, "fp16", tmp_path / "decode.pte")
    report = run_parity(comp, exporter, result.files, "float16", "fp16", None, 2)
    assert report.verdict == "pass", report.to_json()
    if half and report.half_arithmetic["floor_db"] is not None:  # it failed the fixed gates: the floor's decided
        floor = report.half_arithmetic["floor_db"]
        assert 25 < floor < 35 and report.threshold_db == max(HALF_ARITHMETIC_MIN_DB, floor - 6), report.half_arithmetic
    elif half:
        assert report.threshold_db == 30.0 and report.min_snr_db >= 30.0, report.to_json()
    else:
        assert report.half_arithmetic is None and report.min_snr_db > 40, report.to_json()

    # the gates a half-accumulating runtime sets, on every host
    monkeypatch.setattr(type(RUNTIMES.get("executorch")), "accumulates_in_half", lambda self: True)
    broken = plant(comp, "head_dropped")
    result = exporter.export(broken, "fp16", tmp_path / "broken.pte")
    report = run_parity(broken, exporter, result.files, "float16", "fp16", None, 2)
    assert report.half_arithmetic and report.threshold_db < 30, report.to_json()
    assert report.verdict == "fail" and report.min_snr_db < 10 and report.lowering["verdict"] == "fail", report.to_json()
