"""AI Hub adapter against a fake AI Hub that speaks the real qai-hub client's protocol
(tests/fake_aihub.py): success with on-device parity, and every failure path as one line."""

from __future__ import annotations

import io
import json
import sys
import time
import zipfile
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import cli_here, run_cli
from fake_aihub import FakeAIHub
from test_cli_errors import assert_one_line_error
from torch import nn

from edgex.component import Component, TensorSpec
from edgex.errors import EdgexError
from edgex.exporters import EXPORTERS
from edgex.hub import HubSettings, connect, device_parity
from edgex.hub.artifacts import prepare
from edgex.targets import get_target

pytestmark = pytest.mark.xdist_group("hub")  # its module fixture is built once

S25 = "Samsung Galaxy S25"
TIMEOUT_S = 10  # each job's limit here: edgex polls every timeout / 100 s, so a fake job's few polls take 0.1 s each
PASSED = {"verdict": "pass", "threshold_db": 60.0}  # the local parity block


class _Toy(nn.Module):
    """A small graph with a float and an int64 input (the HTP narrows int64: the adapter must follow)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x, position):
        return torch.tanh(self.proj(x)) * (position.to(x.dtype) + 1.0)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A component with an eager reference and two samples, exported by the real ONNX exporter."""
    torch.manual_seed(0)
    module = _Toy().eval()

    def reference(x, position):
        return (torch.tanh(x @ module.proj.weight.T + module.proj.bias) * (position.float() + 1.0),)

    samples = {name: (torch.randn(1, 4, 8), torch.tensor([k])) for k, name in enumerate(("example", "held_out"))}
    component = Component("toy", "talker", module, [TensorSpec("x", (1, 4, 8), "float32"), TensorSpec("position", (1,), "int64")],
                          [TensorSpec("y", (1, 4, 8), "float32")], reference, samples)
    out = tmp_path_factory.mktemp("toy")
    result = EXPORTERS.get("onnx").export(component, "fp32", out / "toy.fp32.onnx")
    return component, result.files


@pytest.fixture
def ini(tmp_path, monkeypatch):
    """Points the qai-hub client (here and in CLI subprocesses) at a config file under tmp_path."""
    path = tmp_path / "client.ini"
    monkeypatch.setenv("QAIHUB_CLIENT_INI", str(path))
    return path


def _parity(hub_settings, toy, out_dir):
    component, files = toy
    conn = connect(hub_settings, get_target("cpu"))
    return device_parity(conn, component, files, "float32", PASSED, out_dir)


def test_device_parity_runs_compile_profile_and_inference(toy, ini, tmp_path):
    with FakeAIHub() as hub:
        hub.write_config(ini)
        block = _parity(HubSettings(S25, TIMEOUT_S), toy, tmp_path)
    assert block["method"] == "device" and block["device"] == S25 and block["verdict"] == "pass"
    assert block["min_snr_db"] == "inf" or block["min_snr_db"] > 100  # ONNX Runtime as the device, fp32
    assert set(block["samples"]) == {"example", "held_out"}
    assert block["compile_options"] == "--target_runtime onnx --compute_unit cpu" and block["submitted_as"] == "ONNX -> ONNX for the CPU"
    assert block["latency_ms"] > 0 and block["compute_units"] == {"NPU": 1}
    compile_job, profile_job, inference_job = (hub.jobs[block["jobs"][k]["id"]] for k in ("compile", "profile", "inference"))
    assert compile_job["device"] == profile_job["device"] == inference_job["device"] == S25
    assert compile_job["options"] == "--target_runtime onnx --compute_unit cpu"
    assert inference_job["received"] == {"x": ["float32"] * 2, "position": ["int32"] * 2}  # cast to the compiled model's spec
    uploaded = hub.models[compile_job["model"]]
    assert uploaded["is_directory"]  # .onnx + .onnx.data travel together as a folder
    with zipfile.ZipFile(io.BytesIO(uploaded["data"])) as z:
        assert sorted(z.namelist()) == ["toy.fp32.onnx/", "toy.fp32.onnx/toy.fp32.onnx", "toy.fp32.onnx/toy.fp32.onnx.data"]
    target = tmp_path / block["target_model"]["path"]
    assert target.is_file() and target.stat().st_size == block["target_model"]["bytes"]


def test_device_parity_leaves_temp_as_it_was(toy, ini, tmp_path, fresh_tempdir):
    """qai-hub zips an uploaded folder into temp and leaves an empty file there per downloaded
    dataset; neither outlives the device run, which may run in this process (not forked)."""
    with FakeAIHub() as hub:
        hub.write_config(ini)
        before = set(fresh_tempdir.iterdir())  # the fake's own folder
        assert _parity(HubSettings(S25, TIMEOUT_S), toy, tmp_path)["verdict"] == "pass"
        assert set(fresh_tempdir.iterdir()) == before


def test_a_numerically_broken_device_build_fails_the_gate(toy, ini, tmp_path):
    with FakeAIHub(noise=0.1) as hub:
        hub.write_config(ini)
        block = _parity(HubSettings(S25, TIMEOUT_S), toy, tmp_path)
    assert block["method"] == "device" and block["verdict"] == "fail"
    assert 10 < block["min_snr_db"] < 30


@pytest.mark.parametrize("kind", ["compile", "profile", "inference"])
def test_a_failed_job_is_one_line_with_its_reason(toy, ini, tmp_path, kind):
    with FakeAIHub(fail=kind) as hub:
        hub.write_config(ini)
        with pytest.raises(EdgexError, match=rf"AI Hub {kind} job j\d+ failed on {S25}: fake AI Hub: {kind} failed") as info:
            _parity(HubSettings(S25, TIMEOUT_S), toy, tmp_path)
    assert "\n" not in str(info.value)


def test_a_job_that_never_finishes_times_out(toy, ini, tmp_path):
    with FakeAIHub(hang="inference") as hub:
        hub.write_config(ini)
        start = time.monotonic()
        with pytest.raises(EdgexError, match=rf"AI Hub inference job j\d+ on {S25} did not finish within 1 s \(still RUNNING_INFERENCE\)"):
            _parity(HubSettings(S25, 1), toy, tmp_path)
    assert time.monotonic() - start < 15


def test_no_token_says_how_to_configure_one(ini):
    with pytest.raises(EdgexError, match=r"no AI Hub token: .*client.ini does not exist; run `qai-hub configure --api_token TOKEN`"):
        connect(HubSettings(S25), get_target("cpu"))
    ini.write_text("[api]\napi_token = \napi_url = http://127.0.0.1:9\nweb_url = http://127.0.0.1:9\n")
    with pytest.raises(EdgexError, match=r"no AI Hub token in .*client.ini: run `qai-hub configure"):
        connect(HubSettings(S25), get_target("cpu"))


def test_a_rejected_token_is_a_401_line(ini):
    with FakeAIHub() as hub:
        hub.write_config(ini, token="expired")
        with pytest.raises(EdgexError, match=r"AI Hub rejected the API token \(401\) .*qai-hub configure"):
            connect(HubSettings(S25), get_target("cpu"))
    assert hub.requests == [("GET", "/api/v1/devices/")]


def test_unknown_device_and_target_without_device(ini):
    with FakeAIHub() as hub:
        hub.write_config(ini)
        with pytest.raises(EdgexError, match=r"AI Hub has no device 'Galaxy S99' \(known: .*Samsung Galaxy S25"):
            connect(HubSettings("Galaxy S99"), get_target("cpu"))
        with pytest.raises(EdgexError, match=r"target cpu names no AI Hub device: pass --hub-device NAME"):
            connect(HubSettings(), get_target("cpu"))


def test_formats_ai_hub_cannot_run_are_recorded_not_submitted(toy, ini, tmp_path):
    component, _ = toy
    pte = tmp_path / "toy.fp32.pte"
    pte.write_bytes(b"not submitted")
    with FakeAIHub() as hub:
        hub.write_config(ini)
        conn = connect(HubSettings(S25), get_target("cpu"))
        block = device_parity(conn, component, [pte], "float32", PASSED, tmp_path)
        skipped = device_parity(conn, component, [pte], "float32", PASSED | {"verdict": "fail"}, tmp_path)
    assert block["method"] == "none" and block["verdict"] == "unverified" and "not .pte artifacts" in block["reason"]
    assert skipped["method"] == "none" and "local parity verdict is fail" in skipped["reason"]
    assert not hub.jobs and not hub.models


def test_submission_follows_the_artifact_files(tmp_path):
    def files(*names):
        for name in names:
            (tmp_path / name).write_bytes(b"x")
        return [tmp_path / name for name in names]

    epcontext = prepare(files("a.onnx", "a.bin", "a.dlc"), tmp_path / "work")
    assert epcontext.compile_options == "--target_runtime precompiled_qnn_onnx" and epcontext.kind == "EPContext ONNX (HTP)"
    assert sorted(p.name for p in epcontext.upload.iterdir()) == ["a.bin", "a.onnx"] and epcontext.upload.name == "a.onnx"
    plain = prepare(files("b.onnx"), tmp_path / "work")
    assert plain.upload == tmp_path / "b.onnx" and plain.compile_options == "--target_runtime onnx --compute_unit cpu"
    for name, kind in (("c.dlc", "QNN DLC"), ("d.bin", "QNN context binary")):
        device_model = prepare(files(name), tmp_path / "work")
        assert device_model.compile_options is None and device_model.kind == kind
    assert "not .mnn artifacts" in prepare(files("e.mnn"), tmp_path / "work")


def test_missing_qai_hub_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "qai_hub", None)  # import qai_hub -> ImportError
    with pytest.raises(EdgexError, match=r"needs qai-hub, which is not installed: pip install 'edgex\[hub\]'"):
        connect(HubSettings(S25), get_target("cpu"))


def test_cli_hub_setup_errors_are_one_line(ini, tmp_path):
    args = ("export", "qwen3-tts", "--preset", "tiny", "-c", "talker_decode", "-f", "onnx", "--out", str(tmp_path / "o"))
    assert_one_line_error(run_cli(*args, "--hub-device", S25), "no AI Hub token", "qai-hub configure")
    with FakeAIHub() as hub:
        hub.write_config(ini, token="expired")
        assert_one_line_error(run_cli(*args, "--hub-device", S25), "AI Hub rejected the API token (401)")
        hub.write_config(ini)
        assert_one_line_error(run_cli(*args, "--hub"), "target cpu names no AI Hub device")
    assert not any((tmp_path / "o").rglob("*.onnx"))


def test_cli_export_records_on_device_parity(ini, tmp_path):
    """The real path: tiny talker_decode exported to ONNX, gated locally, then compiled, profiled and
    run on the (fake) device; the manifest carries both parity blocks."""
    with FakeAIHub() as hub:
        hub.write_config(ini)
        proc = cli_here("export", "qwen3-tts", "--target", "cpu", "--preset", "tiny", "-c", "talker_decode", "-f", "onnx",
                        "-p", "fp32", "--hub-device", S25, "--hub-timeout", str(TIMEOUT_S), "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads(proc.stdout)
    assert manifest["hub"]["device"] == S25 and manifest["tool_versions"]["qai-hub"] == "0.56.0"
    (artifact,) = manifest["artifacts"]
    device = artifact["device_parity"]
    assert artifact["parity"]["method"] == "runtime" and artifact["verdict"] == "pass"
    assert device["method"] == "device" and device["verdict"] == "pass" and device["latency_ms"] > 0
    assert device["min_snr_db"] > 100 and device["samples"].keys() == artifact["parity"]["samples"].keys()
    assert [j["options"] for j in hub.jobs_of("compile")] == ["--target_runtime onnx --compute_unit cpu"]  # target cpu: the CPU
    assert (tmp_path / "qwen3-tts" / "cpu" / device["target_model"]["path"]).is_file()


class _Pair(nn.Module):
    """Two outputs of one shape, far apart in value: taken by position in the wrong order, each fails."""

    def forward(self, x):
        return torch.tanh(x), x * 3.0 + 1.0


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    module = _Pair().eval()
    samples = {name: (torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(k)),) for k, name in enumerate(("example", "held_out"))}
    component = Component("pair", "decoder", module, [TensorSpec("x", (1, 4, 8), "float32")],
                          [TensorSpec("squashed", (1, 4, 8), "float32"), TensorSpec("scaled", (1, 4, 8), "float32")],
                          lambda x: (torch.tanh(x), x * 3.0 + 1.0), samples)
    out = tmp_path_factory.mktemp("pair")
    return component, EXPORTERS.get("onnx").export(component, "fp32", out / "pair.fp32.onnx").files


@pytest.mark.parametrize("unit, compiled, run", [
    ("npu", "--target_runtime qnn_context_binary", "--compute_unit npu"),
    ("gpu", "--target_runtime qnn_dlc --compute_unit gpu", "--compute_unit gpu"),
    ("cpu", "--target_runtime onnx --compute_unit cpu", "--compute_unit cpu"),
    (None, "--target_runtime onnx --compute_unit cpu", "--compute_unit cpu"),  # no placement: what ran here, the CPU
])
def test_compile_and_run_options_follow_the_placement(toy, ini, tmp_path, unit, compiled, run):
    """A plain ONNX graph placed on the GPU (Code2Wav on the S25) is compiled and run on the GPU, one
    placed on the CPU on the CPU, one on the HTP as a context binary: what `--hub` runs is what the
    placement says, never a context binary whatever the placement."""
    component, files = toy
    with FakeAIHub() as hub:
        hub.write_config(ini)
        block = device_parity(connect(HubSettings(S25, TIMEOUT_S), get_target("cpu")), component, files, "float32", PASSED, tmp_path, unit)
    assert block["verdict"] == "pass" and block["compute_unit"] == (unit or "cpu")
    assert [j["options"] for j in hub.jobs_of("compile")] == [compiled] and block["compile_options"] == compiled
    assert sorted(j["options"] for j in (*hub.jobs_of("profile"), *hub.jobs_of("inference"))) == [run, run]


def test_the_s25_placements_name_their_compute_units():
    target = get_target("s25-htp")
    assert {r: target.placements_for(r)[0].compute_unit for r in ("talker", "decoder", "fp32", "vision")} == {
        "talker": "npu", "decoder": "gpu", "fp32": "cpu", "vision": "npu"}


def test_device_outputs_are_taken_by_name(pair, ini, tmp_path):
    """The device's output dataset lists the outputs in another order: each is scored as the output
    its name says, and an output the device did not return by name is a one-line error."""
    component, files = pair
    with FakeAIHub(reverse_outputs=True) as hub:
        hub.write_config(ini)
        block = device_parity(connect(HubSettings(S25, TIMEOUT_S), get_target("cpu")), component, files, "float32", PASSED, tmp_path)
    assert block["verdict"] == "pass" and all(float(s["snr_db"]) > 100 for s in block["samples"]["example"].values())
    renamed = Component("pair", "decoder", component.module, component.inputs,
                        [TensorSpec("first", (1, 4, 8), "float32"), TensorSpec("scaled", (1, 4, 8), "float32")],
                        component.reference, component.samples)
    with FakeAIHub() as hub:
        hub.write_config(ini)
        with pytest.raises(EdgexError, match="returned outputs squashed, scaled; pair declares first, scaled"):
            device_parity(connect(HubSettings(S25, TIMEOUT_S), get_target("cpu")), renamed, files, "float32", PASSED, tmp_path)


class _Scheme:
    """A scheme reference that computes what the eager model does (a faithful fp16-like scheme)."""

    label = "test scheme"

    def __init__(self, component):
        self.component = component

    def __call__(self, inputs, forced_tokens=None):
        return self.component.reference(*inputs)

    def to_json(self):
        return {}


def test_a_sidecar_never_run_here_passes_only_by_its_own_device_run_at_the_lowering_gate(toy, ini, tmp_path):
    """A `.dlc` nothing here runs (local method none) goes to the device as itself, on its
    placement's compute unit; its device outputs are split against the scheme reference, so a device
    build 26 dB off passes the 10 dB policy gate end to end and still fails the 30 dB lowering gate:
    the sidecar is "fail", never "pass". A faithful device run passes it, with both figures."""
    import onnx

    from edgex.export import combined_verdict

    component, files = toy
    dlc = tmp_path / "toy.fp16.dlc"  # the fake device runs ONNX whatever the name: a stand-in for the QNN IR
    onnx.save(onnx.load(str(files[0])), str(dlc))
    unrun = {"verdict": "unverified", "method": "none", "threshold_db": 10.0}
    blocks = {}
    for noise in (0.0, 0.05):
        with FakeAIHub(noise=noise) as hub:
            hub.write_config(ini)
            blocks[noise] = device_parity(connect(HubSettings(S25, TIMEOUT_S), get_target("cpu")), component, [dlc], "float32", unrun,
                                          tmp_path, "npu", lambda: _Scheme(component), 30.0)
        assert not hub.jobs_of("compile")
        assert [j["options"] for j in hub.jobs_of("inference")] == ["--compute_unit npu"]
    faithful, off = blocks[0.0], blocks[0.05]
    assert faithful["verdict"] == "pass" and faithful["lowering"]["threshold_db"] == 30.0
    assert 10 < float(off["min_snr_db"]) < 30 and off["scheme"]["verdict"] == "pass" and off["lowering"]["verdict"] == "fail"
    assert combined_verdict(unrun["verdict"], None, off["verdict"]) == "fail"
    assert combined_verdict(unrun["verdict"], None, faithful["verdict"]) == "pass"


class _Voice(nn.Module):
    """A sine-source voice: per-sample F0 [1, T] (Hz) integrated into a phase, 8 harmonics. `turn`
    adds a turn to every harmonic's phase (the same sound); `f0_scale` moves its pitch."""

    def __init__(self, turn: float = 0.0, f0_scale: float = 1.0):
        super().__init__()
        self.turn, self.f0_scale = turn, f0_scale

    def forward(self, f0):
        phase = torch.cumsum(f0 * (self.f0_scale * 2 * torch.pi / 24000), dim=-1)
        return sum(torch.sin(k * phase + self.turn) * (0.3 / k) for k in range(1, 9))


def _voice_reference(f0):
    """The eager voice, written apart from the graph: numpy in float64."""
    phase = np.cumsum(f0.double().numpy() * 2 * np.pi / 24000, axis=-1)
    return (torch.from_numpy(sum(0.3 / k * np.sin(k * phase) for k in range(1, 9))).float(),)


@pytest.mark.parametrize("device_build, verdict", [("turned", "pass"), ("negated", "fail"), ("low_f0", "fail")])
def test_a_declared_spectral_output_is_gated_by_its_spectral_figure_on_the_device(ini, tmp_path, device_build, verdict):
    """One second of a 180 Hz voice with vibrato, its `wav` declared spectral: a device build that
    turns every harmonic by 45 degrees sounds the same and passes on its spectral figure and its
    correlation with the reference (0.71) although its waveform SNR (about 2 dB) fails the gate; a
    build that negates the voice (the same spectrogram) fails on its correlation (-1), one whose F0
    is 20 % low on its spectral figure. The same device outputs judged by SNR (the output
    undeclared) fail all three."""
    t = torch.arange(24000, dtype=torch.float32)[None] / 24000
    samples = {name: (180.0 * (1 + 0.02 * torch.sin(2 * torch.pi * rate * t)),) for name, rate in (("example", 5.0), ("held_out", 3.0))}
    module = {"turned": _Voice(turn=torch.pi / 4), "negated": _Voice(turn=torch.pi), "low_f0": _Voice(f0_scale=0.8)}[device_build].eval()
    declared = Component("voice", "decoder", module, [TensorSpec("f0", (1, 24000), "float32")], [TensorSpec("wav", (1, 24000), "float32")],
                         _voice_reference, samples, spectral=("wav",))
    files = EXPORTERS.get("onnx").export(declared, "fp32", tmp_path / "voice.fp32.onnx").files
    local = {"verdict": "pass", "threshold_db": 20.0}
    blocks = {}
    with FakeAIHub() as hub:
        hub.write_config(ini)
        for name, component in (("declared", declared), ("undeclared", replace(declared, spectral=()))):
            blocks[name] = device_parity(connect(HubSettings(S25, TIMEOUT_S), get_target("cpu")), component, files, "float32", local,
                                         tmp_path)
    spectral, by_snr = blocks["declared"], blocks["undeclared"]
    assert spectral["method"] == "device" and spectral["verdict"] == verdict, spectral.get("failures")
    assert by_snr["verdict"] == "fail"
    scores = [s["wav"] for s in spectral["samples"].values()]
    assert all("spectral_db" in s for s in scores)
    if device_build == "low_f0":
        assert float(spectral["min_snr_db"]) < 10
    else:  # the same spectrogram: the correlation tells the turned voice from the negated one
        assert float(spectral["min_snr_db"]) >= 20 and float(spectral["min_waveform_snr_db"]) < 5
        assert (float(spectral["min_waveform_correlation"]) > 0.5) == (device_build == "turned")
    print(f"{device_build}: spectral {float(spectral['min_snr_db']):.1f} dB, waveform SNR {float(spectral['min_waveform_snr_db']):.1f} dB, "
          f"correlation {float(spectral['min_waveform_correlation']):.3f}")
