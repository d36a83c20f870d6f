import json

from conftest import run_cli


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


def test_doctor_reports_versions():
    proc = run_cli("doctor", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    versions = {p["package"]: p["version"] for p in data["packages"]}
    assert versions["executorch"] == "1.5.1" and versions["torch"].startswith("2.13.0")
    assert any(r["name"] == "onnxruntime" and r["status"].startswith("available") for r in data["runtimes"])
