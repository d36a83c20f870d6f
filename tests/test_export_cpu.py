"""The README demo: every component in .pte and .onnx, fp32 and fp16, measured in the real runtimes."""

import json

import pytest

from conftest import cpu_export_artifacts, export_cpu
from edgex.recipes.qwen3_tts.facts import ROLES


@pytest.fixture(scope="module")
def manifest(cpu_export):
    out, proc = cpu_export
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    on_disk = json.loads((out / "qwen3-tts" / "cpu" / "manifest.json").read_text())
    assert on_disk["artifacts"] == data["artifacts"]
    return out, data


def test_every_component_format_and_precision_passes_in_its_runtime(manifest):
    _, data = manifest
    got = {(a["component"], a["format"], a["precision"]) for a in data["artifacts"]}
    assert got == cpu_export_artifacts(ROLES)
    for a in data["artifacts"]:
        parity = a["parity"]
        assert parity["method"] == "runtime", a
        assert parity["runtime"] == {"pte": "executorch", "onnx": "onnxruntime"}[a["format"]]
        assert isinstance(parity["min_snr_db"], float) and parity["min_snr_db"] >= parity["threshold_db"], a
        assert a["verdict"] == "pass"
        assert len(parity["samples"]) >= 2  # example + held-out inputs from the eager pipeline
    assert data["status"] == "pass"


def test_fp32_is_near_exact_and_fp16_is_lower(manifest):
    _, data = manifest
    by_key = {(a["component"], a["format"], a["precision"]): a["parity"]["min_snr_db"] for a in data["artifacts"]}
    for comp, fmt, precision in by_key:
        assert by_key[(comp, fmt, "fp32")] > 90.0, (comp, fmt)
        if precision == "fp16":
            assert by_key[(comp, fmt, "fp16")] < by_key[(comp, fmt, "fp32")], (comp, fmt)


def test_manifest_records_files_versions_and_timings(manifest):
    out, data = manifest
    root = out / "qwen3-tts" / "cpu"
    assert data["source"] == {"preset": "tiny", "seed": 0, "weights": "seeded random"}
    assert data["tool_versions"]["torch"].startswith("2.13.0")
    assert data["tool_versions"]["executorch"] == "1.5.1"
    for a in data["artifacts"]:
        assert a["export_seconds"] > 0 and a["export_peak_rss_mb"] > 0
        first = a["files"][0]["path"]
        assert first == f"{a['component']}.{a['precision']}.{a['format']}"
        for f in a["files"]:
            assert (root / f["path"]).stat().st_size == f["bytes"]
            assert len(f["sha256"]) == 64
    assert not list(root.glob(".staging-*")), "staging folders are removed"


def test_predictor_codes_match_in_fp32_and_every_step_is_scored(manifest):
    _, data = manifest
    frames = [a for a in data["artifacts"] if a["component"] == "code_predictor"]
    assert frames
    for a in frames:
        parity = a["parity"]
        if a["precision"] == "fp32":
            assert parity["min_token_agreement"] == 1.0, parity
        assert all(d["tie"] for d in parity["divergences"]), parity["divergences"]  # it passed
        for sample in parity["samples"].values():  # every output scored over every step
            assert {"snr_db", "top1_agreement"} <= set(sample["logits"]) and "snr_db" in sample["codec_embeds"]


def test_onnx_caches_are_fed_per_layer_without_a_copy(manifest):
    """The talker step's stacked KV caches are sliced into one graph input per layer (ONNX Runtime
    would copy the whole cache through a Split on every call); the runtime feeds views of the
    stacked arrays, and the artifact passed runtime parity above."""
    import onnx

    out, data = manifest
    root = out / "qwen3-tts" / "cpu"
    step = next(a for a in data["artifacts"] if (a["component"], a["format"], a["precision"]) == ("talker_decode", "onnx", "fp32"))
    model = onnx.load(str(root / step["files"][0]["path"]), load_external_data=False)
    sliced = json.loads({p.key: p.value for p in model.metadata_props}["edgex.sliced_inputs"])
    layers = sliced.get("past_key", 0)
    assert sliced == {"past_key": layers, "past_value": layers} and layers >= 2
    names = [i.name for i in model.graph.input]
    assert names == ["inputs_embeds", "position", *(f"past_{kv}.{i}" for kv in ("key", "value") for i in range(layers))]
    assert not [n for n in model.graph.node if n.op_type == "Gather" and set(n.input) & set(names)]
    assert step["parity"]["min_snr_db"] > 90.0


def test_onnx_runtime_artifacts_run_its_fused_kernels(manifest):
    """ONNX Runtime artifacts get edgex's RMSNorm, residual + RMSNorm and NeoX RoPE as ONNX
    Runtime's one-kernel ops (`edgex/exporters/onnx_fusions.py`): the talker step computes its RoPE
    table from the position input, the predictor frame's is constant; both passed parity above."""
    _, data = manifest
    for name in ("talker_decode", "code_predictor"):
        step = next(a for a in data["artifacts"] if (a["component"], a["format"], a["precision"]) == (name, "onnx", "fp32"))
        details = step["details"]
        assert min(details.get(k, 0) for k in ("fused_rms_norms", "fused_skip_rms_norms", "fused_rotary_embeddings")) > 0, details
        assert step["parity"]["min_snr_db"] > 90.0


@pytest.mark.benchmark
def test_readme_demo_exports_every_component(tmp_path):
    """The README's first command as written (the suite's `cpu_export` leaves some builds out, as
    conftest's `CPU_EXPORT_PLACEMENTS` says): every component in .pte and .onnx, fp32 and fp16, passes."""
    proc = export_cpu(tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    want = {(c, f, p) for c in ROLES for f in ("pte", "onnx") for p in ("fp32", "fp16")}
    assert {(a["component"], a["format"], a["precision"]) for a in data["artifacts"]} == want
    assert data["status"] == "pass" and all(a["verdict"] == "pass" for a in data["artifacts"])


def test_cpu_places_the_looped_predictor_and_fp32_vocoders_on_executorch_unless_placed_by_name(tmp_path):
    """The recipe's own precisions on ExecuTorch: the runner loops code_predictor_step there (the
    unrolled frame is the model's costliest lowering) and the vocoders stay fp32 (XNNPACK's fp16
    sums fail them at the published size); ONNX builds all of them, and a placement by name builds
    the rest, with the reason recorded."""
    from edgex.plan import make_plan, read_placements

    built = {(j.component, j.exporter, j.precision): j for j in make_plan("qwen3-tts", "cpu", tmp_path).jobs}
    assert not any(c == "code_predictor" and e == "executorch" for c, e, _ in built)
    assert ("code2wav", "executorch", "fp16") not in built and ("latent2wav", "executorch", "fp16") not in built
    assert {("code2wav", "executorch", "fp32"), ("code2latent", "executorch", "fp16"), ("code_predictor", "onnx", "fp16"),
            ("code_predictor_step", "executorch", "fp16"), ("latent2wav", "onnx", "fp16")} <= set(built)
    assert "recipe_precisions" not in dict(built["code_predictor", "onnx", "fp16"].placement)  # ONNX: the role's own
    assert "26.3 dB" in dict(built["code2wav", "executorch", "fp32"].placement)["recipe_precisions"]
    named = make_plan("qwen3-tts", "cpu", tmp_path, placements=read_placements(["code_predictor=executorch:fp32",
                                                                                "code2wav=executorch:fp16"])).jobs
    assert {(j.component, j.exporter, j.precision) for j in named} >= {("code_predictor", "executorch", "fp32"),
                                                                       ("code2wav", "executorch", "fp16")}
