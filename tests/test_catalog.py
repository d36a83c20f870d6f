import json
import os
import platform
import subprocess
import sys
import tempfile

from conftest import run_cli
from edgex.host import SIMD_FEATURES
from edgex.parity.runtimes import RUNTIMES


def test_list_prints_the_registries():
    proc = run_cli("list", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    model = data["models"]["qwen3-tts"]
    assert set(model["presets"]) == {"tiny", "0.6b", "1.7b"}
    assert model["components"]["code2latent"] == "decoder"
    assert "cpu" in data["targets"]
    assert data["formats"]["executorch"]["precisions"] == ["fp32", "fp16", "8da8w", "8da4w", "w8"]
    assert "fp16" in data["precisions"]


def test_doctor_runs_every_runtime_s_smoke_program():
    """Each installed runtime loads its library and computes x + 1 (checked); none is just imported."""
    proc = run_cli("doctor", "--json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    versions = {p["package"]: p["version"] for p in data["packages"]}
    assert versions["executorch"] == "1.5.1" and versions["torch"].startswith("2.13.0")
    runtimes = {r["name"]: r for r in data["runtimes"]}
    assert data["ok"] and {r["status"] for r in runtimes.values()} == {"ok"}, runtimes
    assert runtimes["onnxruntime"]["required"] and runtimes["executorch"]["required"]
    assert "XNNPACK" in runtimes["executorch"]["detail"] and "simulator" in runtimes["qnn-htp"]["detail"]
    half = RUNTIMES.get("executorch").accumulates_in_half()  # XNNPACK's fp16 kernels on this CPU
    assert runtimes["executorch"]["fp16_accumulation"] == ("fp16" if half else "fp32")
    assert ("sums fp16 products in fp16" in runtimes["executorch"]["detail"]) == half
    assert runtimes["onnxruntime"]["fp16_accumulation"] == "fp32"
    box = data["machine"]
    assert box["cpus"] == os.cpu_count() and box["temp_dir"] == tempfile.gettempdir()
    assert 0 < box["memory_available_gb"] <= box["memory_gb"] and box["temp_free_gb"] > 0
    assert box["cpu"] and set(box["cpu_features"]) <= set(SIMD_FEATURES)
    if platform.machine() == "x86_64":  # every x86-64 CPU edgex's wheels run on has AVX2
        assert "avx2" in box["cpu_features"], box


def _doctor_with(code: str, *runtimes: str) -> subprocess.CompletedProcess:
    """`edgex doctor --json -r RUNTIME...` in a fresh process after `code` has broken something."""
    argv = ["edgex", "doctor", "--json", *[a for r in runtimes for a in ("-r", r)]]
    script = f"import sys\n{code}\nfrom edgex.cli import app\nsys.argv = {argv!r}\napp()"
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, env=env, check=False)


def _runtime(proc, name: str) -> dict:
    return next(r for r in json.loads(proc.stdout)["runtimes"] if r["name"] == name)


def test_doctor_fails_when_a_runtime_computes_wrong_numbers():
    """ONNX Runtime imports and loads fine but returns x + 2: doctor says failed and exits 1."""
    proc = _doctor_with("import onnxruntime\n"
                        "real = onnxruntime.InferenceSession.run\n"
                        "onnxruntime.InferenceSession.run = lambda self, *a, **k: [o + 1 for o in real(self, *a, **k)]",
                        "onnxruntime", "mnn")
    assert proc.returncode == 1, proc.stderr[-2000:]
    row = _runtime(proc, "onnxruntime")
    assert row["status"] == "failed" and "smoke program returned" in row["detail"], row
    assert _runtime(proc, "mnn")["status"] == "ok"


def test_doctor_fails_a_required_runtime_that_is_missing_and_only_notes_a_missing_extra():
    proc = _doctor_with("sys.modules['onnxruntime'] = None\nsys.modules['MNN'] = None", "onnxruntime", "mnn")
    assert proc.returncode == 1
    ort, mnn = _runtime(proc, "onnxruntime"), _runtime(proc, "mnn")
    assert ort["status"] == "failed" and "needs onnxruntime, which is not installed" in ort["detail"], ort
    assert mnn["status"] == "missing" and "pip install 'edgex[mnn]'" in mnn["detail"], mnn


def test_doctor_fails_when_a_runtime_library_cannot_load():
    """The QNN plugin pointing at a library that is not there: the HTP backend never loads."""
    proc = _doctor_with("import onnxruntime_qnn\nonnxruntime_qnn.get_library_path = lambda: '/nonexistent/libQnnEp.so'",
                        "qnn-htp")
    assert proc.returncode == 1
    row = _runtime(proc, "qnn-htp")
    assert row["status"] == "failed" and row["detail"], row
