"""Format MNN: .mnn artifacts converted by MNN's own converter, run by MNN for parity, and the
guard that edgex never triggers the MNN Python wrappers' pip installs or telemetry."""

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from conftest import MNN_COMPONENTS, MNN_PLACEMENTS, mnn_export, run_cli
from edgex.errors import EdgexError
from edgex.recipes.qwen3_tts.facts import FACTS


# Each MNN lowering path once in the suite (conftest.py's `MNN_COMPONENTS`, placed as `MNN_PLACEMENTS`
# says); every component at every default precision as a benchmark.
@pytest.mark.parametrize("components", [pytest.param(MNN_COMPONENTS, id="suite"),
                                        pytest.param(FACTS.default_components(), id="every-component", marks=pytest.mark.benchmark)])
def test_mnn_target_exports_components_with_runtime_parity(tmp_path, components):
    out = tmp_path
    expected = {(c, p) for c in components for p in ("fp32", "fp16")}
    if components == MNN_COMPONENTS:
        out, proc = mnn_export()
        placed = {key: precision for key, _, precision in (p.replace("=", ":").split(":") for p in MNN_PLACEMENTS)}
        expected = {(c, p) for c, p in expected if placed.get(c, p) == p}
    else:
        proc = run_cli("export", "qwen3-tts", "--target", "mnn", "--preset", "tiny", "--out", str(out), "--json", "--jobs", "2",
                       "-c", ",".join(components))
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    got = {(a["component"], a["precision"]) for a in data["artifacts"]}
    assert got == expected
    for a in data["artifacts"]:
        assert a["format"] == "mnn" and a["parity"]["method"] == "runtime" and a["parity"]["runtime"] == "mnn"
        assert a["verdict"] == "pass", a["parity"]
        assert (out / "qwen3-tts" / "mnn" / a["files"][0]["path"]).suffix == ".mnn"


class _CountingProxy:
    """A TCP listener on 127.0.0.1 that only counts connections (any pip or HTTP attempt through
    the proxy variables lands here instead of the network)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self._stop.set()
        self._thread.join()
        self.sock.close()


def _freeze():
    return subprocess.run([sys.executable, "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout


def test_mnn_weight_quantization_is_measured_and_installs_nothing_or_touches_the_network(tmp_path):
    """One export (talker_decode in fp32, w8 and w4) in a process whose proxies point at a counting
    listener: the quantized schemes are measured (smaller and lower, above noise), and MNN's wrappers
    neither installed anything nor opened a connection."""
    before = _freeze()
    proxy = _CountingProxy()
    url = f"http://127.0.0.1:{proxy.sock.getsockname()[1]}"
    code = (
        "import sys, json\n"
        "from edgex.export import export_model\n"
        f"m = export_model('qwen3-tts', 'mnn', {str(tmp_path)!r}, preset='tiny', components=['talker_decode'], precisions=['fp32', 'w8', 'w4'])\n"
        "print(json.dumps({'status': m['status'], 'tools': sorted(n for n in sys.modules if n.startswith('MNN.tools')),\n"
        "                  'db': {a['precision']: a['parity']['min_snr_db'] for a in m['artifacts']},\n"
        "                  'bytes': {a['precision']: a['files'][0]['bytes'] for a in m['artifacts']}}))\n"
    )
    env = {"HTTP_PROXY": url, "HTTPS_PROXY": url, "ALL_PROXY": url, "http_proxy": url, "https_proxy": url,
           "PIP_INDEX_URL": url, "PIP_NO_INDEX": "1"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=900)
    proxy.close()
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (result["status"], result["tools"]) == ("pass", [])
    assert proxy.connections == 0
    db, size = result["db"], result["bytes"]
    assert db["fp32"] > db["w8"] > db["w4"] > 5.0
    assert size["fp32"] > size["w8"] > size["w4"]
    assert _freeze() == before


def test_missing_mnn_names_the_extra(monkeypatch):
    from edgex.exporters import EXPORTERS

    monkeypatch.setitem(sys.modules, "MNN", None)  # import MNN -> ImportError
    with pytest.raises(EdgexError, match=r"needs MNN, which is not installed: pip install 'edgex\[mnn\]'"):
        EXPORTERS.get("mnn").check("fp32")


@pytest.mark.parametrize("precision", ["w8", "w4"])
def test_the_mnn_scheme_reference_models_the_converters_conv_quantization(tmp_path, monkeypatch, precision):
    """MNN's converter quantizes a ConvTranspose's weight in its ONNX layout [in, out, k], cut into
    `out` equal runs (and 32-input blocks for w4), not per output channel. One layer, converted and
    run by MNN: the scheme reference's weights (`converter_quantized`, and the file's own weights as
    `mnn_weights` decodes them) reproduce the .mnn's output far beyond any gate, while quantizing per
    true output channel is no closer than fp32."""
    import torch

    from edgex.exporters.mnn import _FLAGS, convert, converter_quantized, minmax_asymmetric
    from edgex.exporters.mnn_weights import quantized_weights
    from edgex.parity.metrics import snr_db
    from edgex.parity.runtimes.mnn import MnnRuntime

    torch.manual_seed(0)
    layer = torch.nn.ConvTranspose1d(64, 48, 8, stride=4).eval()
    x = torch.randn(1, 64, 20)
    torch.onnx.export(layer, (x,), str(tmp_path / "t.onnx"), dynamo=False, opset_version=17)
    convert(tmp_path / "t.onnx", tmp_path / "t.mnn", _FLAGS[precision])
    bits, block = (8, None) if precision == "w8" else (4, 32)

    def output(weight):
        with torch.no_grad():
            return torch.nn.functional.conv_transpose1d(x, weight, layer.bias, stride=4).numpy()

    got = MnnRuntime().load([tmp_path / "t.mnn"]).run([x.numpy()])[0].reshape(output(layer.weight).shape)
    per_output_channel = minmax_asymmetric(layer.weight.transpose(0, 1), bits, block).transpose(0, 1)
    assert snr_db(output(converter_quantized(layer, bits, block)), got) > 100
    # the weights read back from the file (`mnn_weights`, MNN's loader's decoding) are what MNN runs
    (stored,) = quantized_weights(tmp_path / "t.mnn").values()
    assert snr_db(output(torch.from_numpy(stored.weight.reshape(layer.weight.shape))), got) > 100
    # a second read of the same bytes (the scheme, then the stored-tensor check) dumps the file once;
    # a file whose bytes changed is dumped again
    from edgex.exporters import mnn_weights

    dumps, real_dump = [], mnn_weights.dump
    monkeypatch.setattr(mnn_weights, "dump", lambda *a: dumps.append(1) or real_dump(*a))
    (again,) = quantized_weights(tmp_path / "t.mnn").values()
    assert dumps == [] and (again.weight == stored.weight).all()
    with open(tmp_path / "t.mnn", "ab") as f:
        f.write(b"\0" * 8)
    quantized_weights(tmp_path / "t.mnn")
    assert dumps == [1]
    assert snr_db(output(per_output_channel), got) < snr_db(output(layer.weight), got) + 3 < 60


# Run in a child interpreter: MNN's runtime loaded in this worker by an earlier test (its thread pool)
# hangs the MNN run of a job the export forks from it.
_EXTERNAL_WEIGHTS = """
import json, sys
from pathlib import Path
import edgex.exporters.mnn as mnn
from edgex.export import export_model
from edgex.verify import verify_directory
for precision in ("fp32", "w8"):
    mnn._FLAGS[precision] = [*mnn._FLAGS[precision], "--saveExternalData"]
out = Path(sys.argv[1])
manifest = export_model("spark-x2.5", "mnn", out, preset="tiny", components=["decode"], precisions=["fp32", "w8"])
verified = verify_directory(out)["status"]
(out / "spark-x2.5" / "mnn" / "decode.fp32.mnn.weight").unlink()
print(json.dumps({"manifest": manifest, "verified": verified, "without_weights": verify_directory(out)["status"]}))
"""


def test_weights_the_converter_keeps_beside_the_mnn_are_part_of_the_artifact(tmp_path):
    """MNN's converter writes a graph over 2 GB (its flatbuffer's limit) as a `.mnn` and its weights
    in `<name>.weight` beside it; MNN's loaders read them from there, and the `.mnn` alone runs on
    zeros without an error. `--saveExternalData` makes the converter do the same for a tiny graph:
    both files are the artifact (recorded, published, verified), its gather table and its int8
    weights are read back from the weight file, and the folder without that file does not verify."""
    proc = subprocess.run([sys.executable, "-c", _EXTERNAL_WEIGHTS, str(tmp_path)], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    manifest = result["manifest"]
    assert manifest["status"] == "pass", [(a["precision"], a["verdict"], a.get("error")) for a in manifest["artifacts"]]
    for entry in manifest["artifacts"]:
        name = f"decode.{entry['precision']}.mnn"
        assert [f["path"] for f in entry["files"]] == [name, name + ".weight"]
        assert entry["details"]["external_weights"] == name + ".weight"
        assert entry["tensor_parity"]["verdict"] == "pass" and "stored as" in entry["tensor_parity"]["tensors"]["embedding"]["type"]
    (w8,) = [e for e in manifest["artifacts"] if e["precision"] == "w8"]
    assert w8["quantized_parity"]["verdict"] == "pass" and len(w8["quantized_parity"]["tensors"]) > 10, w8["quantized_parity"]
    assert result["verified"] == "pass" and result["without_weights"] != "pass"
