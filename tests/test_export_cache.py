"""An unchanged re-export is reused (`edgex.artifacts.reuse`); anything different exports again,
reusing the jobs whose own key is unchanged.

One real export (tiny talker_prefill, ONNX fp32) is shared by the module. Misses are shown without
paying for an export: the recipe's `load` is made to raise, so a call that gets past the reuse check
fails with `Loaded` before it writes anything. One miss (a flipped byte) is exported for real, to
show the export runs again and passes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import edgex.artifacts.keys
import edgex.toolchain
from conftest import cli_here, run_cli
from edgex.artifacts.keys import job_inputs
from edgex.artifacts.reuse import export_key
from edgex.build.cache import Cache
from edgex.build.spec import load_plan
from edgex.export import export_model
from edgex.plan import make_plan
from edgex.recipes import RECIPES

pytestmark = pytest.mark.xdist_group("export_cache")

ARGS = dict(preset="tiny", components=["talker_prefill"], formats=["onnx"], precisions=["fp32"])
CLI = ("export", "qwen3-tts", "--preset", "tiny", "-c", "talker_prefill", "-f", "onnx", "-p", "fp32")


class Loaded(Exception):
    """The export got past the reuse check and went on to load the model."""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The module's export; it also files its job in an artifact cache of its own (`artifact_cache`),
    which no other test of the module reads."""
    from edgex.artifacts.across import ENV

    out = tmp_path_factory.mktemp("recache")
    with pytest.MonkeyPatch.context() as patched:
        patched.setenv(ENV, str(out.parent / f"{out.name}-artifact-cache"))
        manifest = export_model("qwen3-tts", "cpu", out, **ARGS)
    assert manifest["status"] == "pass" and manifest["reused"] is False, manifest
    return out, manifest


@pytest.fixture
def no_load(monkeypatch):
    def load(*args, **kwargs):
        raise Loaded

    monkeypatch.setattr(RECIPES.get("qwen3-tts"), "load", load)


def files_state(root: Path) -> dict:
    """Every file under `root` with its inode, mtime and content: what a hit must leave untouched."""
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


def copy_of(exported, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the shared export: (output root, its <model>/<target> folder)."""
    out, _ = exported
    shutil.copytree(out, tmp_path / "out")
    return tmp_path / "out", tmp_path / "out" / "qwen3-tts" / "cpu"


def test_an_unchanged_reexport_is_a_hit_that_loads_nothing(exported, no_load):
    out, first = exported
    folder = out / "qwen3-tts" / "cpu"
    recorded = json.loads((folder / "manifest.json").read_text())["export_key"]
    assert recorded["sha256"] == first["export_key"]["sha256"] and len(recorded["inputs"]["jobs"]) == 1
    assert recorded["inputs"]["jobs"][0]["component"] == "talker_prefill" and recorded["inputs"]["preset"] == "tiny"
    before = files_state(out)
    again = export_model("qwen3-tts", "cpu", out, **ARGS)  # the recipe's load raises: reaching it fails
    assert again["reused"] is True and again["created"] == first["created"]
    assert {k: v for k, v in again.items() if k != "reused"} == {k: v for k, v in first.items() if k != "reused"}
    assert files_state(out) == before, "a hit writes nothing: same inodes, mtimes and bytes"
    # the same inputs spelled otherwise: the default preset, the default gates given as nothing
    assert export_model("qwen3-tts", "cpu", out, **{**ARGS, "preset": None}, min_db={})["reused"] is True


@pytest.mark.parametrize("change", ["seed", "precision", "gate", "lowering-gate", "threads", "force", "edgex-source",
                                    "tool-version", "cpu-features"])
def test_other_inputs_are_misses(exported, no_load, monkeypatch, change):
    out, _ = exported
    before = files_state(out)
    args = dict(ARGS)
    if change == "seed":
        args["seed"] = 1
    elif change == "precision":
        args["precisions"] = ["fp16"]
    elif change == "gate":
        args["min_db"] = {"talker": 70.0}
    elif change == "lowering-gate":  # an override of the lowering gate is held by the fp32 job too
        args["min_db"] = {"lowering": 35.0}
    elif change == "threads":
        args["threads"] = 2
    elif change == "force":
        args.update(reuse=False, reuse_jobs=False)
    elif change == "edgex-source":
        monkeypatch.setattr(edgex.artifacts.keys, "edgex_source_sha256", lambda: "0" * 64)
    elif change == "cpu-features":  # another host kind: its runtimes choose other kernels
        monkeypatch.setattr("edgex.host.cpu_features", lambda: ["avx2", "fma", "f16c"])
    else:
        monkeypatch.setattr(edgex.toolchain, "version", lambda dist: "0.0" if dist == "torch" else None)
    with pytest.raises(Loaded):
        export_model("qwen3-tts", "cpu", out, **args)
    assert files_state(out) == before


def test_a_change_that_moves_no_artifact_rewrites_the_manifest_and_builds_nothing(exported, no_load, tmp_path):
    """The export key differs (the manifest records the accepted unverified kinds), the job's own key
    does not: the entry and its file are kept, nothing is loaded, the manifest is written anew."""
    out, folder = copy_of(exported, tmp_path)
    first = json.loads((folder / "manifest.json").read_text())
    artifact = {k: v for k, v in files_state(out).items() if not k.endswith("manifest.json")}
    args = {**ARGS, "allow_unverified": ["sidecar"]}
    again = export_model("qwen3-tts", "cpu", out, **args)
    assert again["reused"] is False and again["allow_unverified"] == ["sidecar"] and again["status"] == "pass"
    assert again["export_key"]["sha256"] != first["export_key"]["sha256"]
    (entry,) = again["artifacts"]
    assert entry["reused"] is True and {k: v for k, v in entry.items() if k != "reused"} == first["artifacts"][0]
    assert {k: v for k, v in files_state(out).items() if not k.endswith("manifest.json")} == artifact
    assert export_model("qwen3-tts", "cpu", out, **args)["reused"] is True, "then it is a whole hit"


def test_a_full_disk_at_the_manifest_is_one_line_and_publishes_nothing(exported, no_load, tmp_path, monkeypatch):
    """The manifest is the export's last write; a disk that fills there ends the command in one
    `edgex:` line, exit 2, the folder as it was and no temporary files left."""
    from typer.testing import CliRunner

    import edgex.export
    from edgex.cli import app

    out, _ = copy_of(exported, tmp_path)
    before = files_state(out)

    def full_disk(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(edgex.export, "write_json_atomic", full_disk)
    result = CliRunner().invoke(app, [*CLI, "--allow-unverified", "sidecar", "--out", str(out)])
    lines = [line for line in result.stderr.splitlines() if line.startswith("edgex: ")]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output[-3000:]
    assert lines == [f"edgex: cannot write the manifest to {out / 'qwen3-tts' / 'cpu'}: No space left on device; the export "
                     "stopped and removed its temporary files (the folder's published files are unchanged)"], result.stderr
    assert files_state(out) == before and not [p for p in out.rglob(".*") if p.name != ".edgex-cache"]


def _no_key(m):
    del m["export_key"], m["artifacts"][0]["job_key"]


def _other_job_key(m):
    m["export_key"] = "abc"
    m["artifacts"][0]["job_key"] = "0" * 64


def _errored(m):
    m["artifacts"][0]["verdict"] = "error"


@pytest.mark.parametrize("damage", ["flipped-byte", "deleted-file", "no-key", "errored-entry", "other-job-key", "not-json",
                                    "a-list", "no-manifest"])
def test_a_damaged_folder_or_manifest_is_a_miss_never_a_crash(exported, no_load, tmp_path, damage):
    out, folder = copy_of(exported, tmp_path)
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    artifact = folder / manifest["artifacts"][0]["files"][0]["path"]
    if damage == "flipped-byte":
        data = bytearray(artifact.read_bytes())
        data[len(data) // 2] ^= 0xFF
        artifact.write_bytes(bytes(data))
    elif damage == "deleted-file":
        artifact.unlink()
    elif damage == "not-json":
        manifest_path.write_bytes(b"\x00{not json")
    elif damage == "a-list":
        manifest_path.write_text("[]")
    elif damage == "no-manifest":
        manifest_path.unlink()
    else:  # a manifest of an older edgex (no keys), an entry whose export errored, an entry of other inputs
        {"no-key": _no_key, "errored-entry": _errored, "other-job-key": _other_job_key}[damage](manifest)
        manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(Loaded):
        export_model("qwen3-tts", "cpu", out, **ARGS)


def test_a_flipped_byte_is_exported_again_and_passes(exported, tmp_path):
    out, folder = copy_of(exported, tmp_path)
    first = json.loads((folder / "manifest.json").read_text())
    record = first["artifacts"][0]["files"][0]
    data = bytearray((folder / record["path"]).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (folder / record["path"]).write_bytes(bytes(data))
    again = export_model("qwen3-tts", "cpu", out, **ARGS)
    assert again["reused"] is False and again["status"] == "pass" and again["artifacts"][0]["verdict"] == "pass"
    assert again["export_key"]["sha256"] == first["export_key"]["sha256"]
    assert again["artifacts"][0]["files"][0] == record, "ONNX rebuilds to the same bytes"
    assert json.loads((folder / "manifest.json").read_text())["created"] == again["created"], "the manifest was rewritten"


def test_an_export_made_on_another_host_kind_gates_again_here(exported, tmp_path, monkeypatch):
    """The folder's export was made on this host; on a host with other CPU features the same
    command neither reuses the export nor keeps its entry: the artifact is built and its parity run
    here, and the manifest records this host's features."""
    out, folder = copy_of(exported, tmp_path)
    first = json.loads((folder / "manifest.json").read_text())
    other = ["asimd", "asimdhp", "asimddp"]  # an Arm host's
    assert first["host"].get("cpu_features") not in (None, other)
    monkeypatch.setattr("edgex.host.cpu_features", lambda: other)
    again = export_model("qwen3-tts", "cpu", out, **ARGS)
    assert again["reused"] is False and again["export_key"]["sha256"] != first["export_key"]["sha256"]
    (entry,) = again["artifacts"]
    assert "reused" not in entry and entry["job_key"] != first["artifacts"][0]["job_key"]
    assert entry["verdict"] == "pass" and entry["parity"]["seconds"] > 0, "parity ran again"
    assert again["created"] != first["created"] or again["seconds"] != first["seconds"]
    assert again["host"]["cpu_features"] == other and again["export_key"]["inputs"]["cpu_features"] == other


def test_build_keys_follow_the_cpu_features_and_llama_cpps_cpu_backend(tmp_path, monkeypatch):
    """Every build key changes with the host's CPU features; a GGUF artifact's also with the CPU
    backend the llama.cpp build loaded (`Runtime.build_variant`), and no other artifact's."""
    file = tmp_path / "b.toml"
    file.write_text('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu", "llama-cpp"]\n')
    jobs = load_plan(file).jobs
    assert {j.exporter for j in jobs} >= {"gguf", "onnx"}
    before = _keys(jobs, Cache(tmp_path / "cache"))
    monkeypatch.setattr("edgex.host.cpu_features", lambda: ["avx2"])
    features = _keys(jobs, Cache(tmp_path / "cache"))
    assert all(features[j.id] != before[j.id] for j in jobs)
    monkeypatch.undo()
    monkeypatch.setattr("edgex.parity.runtimes.llamacpp._cpu_backend", lambda: "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 |")
    backend = _keys(jobs, Cache(tmp_path / "cache"))
    assert {j.id for j in jobs if backend[j.id] != before[j.id]} == {j.id for j in jobs if j.exporter == "gguf"}


def test_the_cli_says_reused_in_one_line_and_exits_with_the_manifest_status(exported, tmp_path):
    out, first = exported
    before = files_state(out)
    proc = cli_here(*CLI, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.splitlines() == [f"unchanged since {first['created']}: reused 1 artifact(s) (manifest "
                                        f"{first['manifest_path']}; --force re-exports)"]
    assert "talker_prefill" in proc.stdout and f"manifest: {first['manifest_path']}" in proc.stdout
    data = json.loads(cli_here(*CLI, "--out", str(out), "--json").stdout)
    assert data["reused"] is True and data["artifacts"] == first["artifacts"] and data["created"] == first["created"]
    assert files_state(out) == before
    # bad input is still one `edgex:` line and exit 2 before anything is reused
    bad = run_cli(*CLI, "--out", str(out), "--min-db", "nosuch=3")
    assert bad.returncode == 2 and bad.stderr.startswith("edgex: --min-db nosuch=...") and "Traceback" not in bad.stderr
    # the exit code is the reused manifest's: 1 for a failed one (its verdict edited here: the files
    # and the key are what a hit checks, the recorded verdicts stand as written)
    copy, folder = copy_of(exported, tmp_path)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["artifacts"][0]["verdict"] = manifest["status"] = "fail"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    failed = cli_here(*CLI, "--out", str(copy))
    assert failed.returncode == 1 and "reused 1 artifact(s)" in failed.stderr
    assert "parity gate failed for 1 artifact(s): talker_prefill.fp32.onnx" in failed.stderr


def test_cli_force_exports_without_looking(exported, monkeypatch):
    """`--force` reaches `export_model` with neither the whole export nor any job reused (which
    `test_other_inputs_are_misses[force]` shows then loads and builds); without it a hit never does."""
    from typer.testing import CliRunner

    import edgex.export
    from edgex.cli import app

    out, first = exported
    calls = []

    def fake(*args, **kwargs):
        calls.append(kwargs)
        return {**first, "reused": False}

    monkeypatch.setattr(edgex.export, "export_model", fake)
    runner = CliRunner()
    assert runner.invoke(app, [*CLI, "--out", str(out), "--json"]).exit_code == 0 and calls == []
    result = runner.invoke(app, [*CLI, "--out", str(out), "--json", "--force"])
    assert result.exit_code == 0 and len(calls) == 1 and calls[0]["reuse"] is False and calls[0]["reuse_jobs"] is False


def test_a_changed_checkpoint_file_changes_the_key(tmp_path):
    folder = tmp_path / "ckpt"
    (folder / "speech_tokenizer").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "speech_tokenizer" / "model.safetensors").write_bytes(b"\x01" * 64)
    plan = make_plan("qwen3-tts", "cpu", tmp_path, checkpoint=folder, components=["talker_prefill"], formats=["onnx"])
    args = dict(seed=0, settings=None, min_db=None, threads=None, allow_unverified=[])
    key = export_key(plan, **args)
    assert key["inputs"]["checkpoint_sha256"] and "preset" not in key["inputs"]
    assert export_key(plan, **args)["sha256"] == key["sha256"]
    (folder / "speech_tokenizer" / "model.safetensors").write_bytes(b"\x01" * 63 + b"\x02")
    assert export_key(plan, **args)["sha256"] != key["sha256"]


def test_build_and_export_key_an_artifact_alike(tmp_path):
    """One definition: the build cache's key inputs of a job are the export key's inputs for it."""
    file = tmp_path / "b.toml"
    file.write_text('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu"]\ncomponents = ["talker_decode"]\nformats = ["onnx"]\n'
                    'precisions = ["fp16"]\nmin_db = { lowering = 35 }\nthreads = 2\n')
    (job,) = load_plan(file).jobs
    cache = Cache(tmp_path / "cache")
    built = cache.key_inputs(job, {"preset": "tiny"})
    plan = make_plan("qwen3-tts", "cpu", tmp_path, components=["talker_decode"], formats=["onnx"], precisions=["fp16"])
    key = export_key(plan, seed=0, settings={}, min_db={"lowering": 35.0}, threads=2, allow_unverified=[])["inputs"]
    (exported_job,) = key.pop("jobs")
    assert built == {**{k: v for k, v in key.items() if k not in ("gate_overrides", "allow_unverified")}, **exported_job}
    assert built["lowering_db"] == 35.0, "the lowering gate moves an fp16 verdict: it is in the key"
    assert job_inputs(plan.jobs[0], {}, 2)["lowering_db"] == 30.0


def _keys(jobs, cache) -> dict[str, str]:
    weights = {"preset": "tiny"}
    return {job.id: cache.key(cache.key_inputs(job, weights)) for job in jobs}


@pytest.mark.parametrize("dist, shaped", [
    ("lerobot", lambda job: job.model == "act"),  # ACT's reference is LeRobot's code
    ("torchvision", lambda job: job.model == "act"),  # its ResNet trunk
    ("qwen-tts", lambda job: job.model == "qwen3-tts"),
    ("transformers", lambda job: job.model == "qwen3-tts"),
    ("gguf", lambda job: job.exporter == "gguf"),  # the toolchain of one format
    ("onnxruntime-qnn", lambda job: job.exporter == "qnn"),
    ("numpy", lambda job: True),
])
def test_a_package_version_invalidates_exactly_the_artifacts_it_shapes(tmp_path, monkeypatch, dist, shaped):
    """Every key of a build of three models on several targets, before and after one package's
    version changes: the artifacts that package shapes (its reference or its toolchain) get new keys,
    every other keeps its own."""
    file = tmp_path / "b.toml"
    file.write_text('[[entry]]\nmodel = "qwen3-tts"\ntargets = ["cpu", "llama-cpp", "s25-htp"]\n'
                    '[[entry]]\nmodel = "spark-x2.5"\ntargets = ["cpu", "llama-cpp"]\n'
                    '[[entry]]\nmodel = "act"\ntargets = ["cpu"]\n')
    jobs = load_plan(file).jobs
    cache = Cache(tmp_path / "cache")
    before = _keys(jobs, cache)
    real = edgex.toolchain.version
    monkeypatch.setattr(edgex.toolchain, "version", lambda name: "99.0" if name == dist else real(name))
    after = _keys(jobs, cache)
    changed = {job.id for job in jobs if before[job.id] != after[job.id]}
    expected = {job.id for job in jobs if shaped(job)}
    assert expected and changed == expected


def test_smolvla_vlm_config_outside_the_checkpoint_is_in_the_key(tmp_path):
    """SmolVLA builds its VLM from the config `vlm_model_name` names, outside the checkpoint folder:
    editing that config changes the weights' key; the checkpoint's own hash stays."""
    vlm = tmp_path / "vlm"
    vlm.mkdir()
    (vlm / "config.json").write_text('{"model_type": "smolvlm", "scale_factor": 4}')
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"type": "smolvla", "vlm_model_name": str(vlm)}))
    before = edgex.artifacts.keys.weights_inputs("smolvla", None, checkpoint)
    assert before["external"] == {"vlm_model_name": str(vlm), "vlm_config_sha256": edgex.artifacts.files.sha256(vlm / "config.json")}
    (vlm / "config.json").write_text('{"model_type": "smolvlm", "scale_factor": 2}')
    after = edgex.artifacts.keys.weights_inputs("smolvla", None, checkpoint)
    assert after["checkpoint_sha256"] == before["checkpoint_sha256"] and after != before


def test_an_export_with_one_job_changed_builds_that_job_alone(exported, tmp_path):
    """The shared export plus an fp16 build: the fp32 entry and its file are kept as they were
    (same inode and bytes), the fp16 artifact is built and gated; the CLI says how many it reused."""
    out, folder = copy_of(exported, tmp_path)
    first = json.loads((folder / "manifest.json").read_text())
    kept = files_state(out)
    proc = cli_here(*CLI, "-p", "fp16", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reused 1 unchanged artifact(s) (1 of the earlier export in this folder), built 1" in proc.stderr
    manifest = json.loads((folder / "manifest.json").read_text())
    fp32, fp16 = manifest["artifacts"]
    assert fp32["reused"] is True and {k: v for k, v in fp32.items() if k != "reused"} == first["artifacts"][0]
    assert "reused" not in fp16 and fp16["precision"] == "fp16" and fp16["verdict"] == "pass" and fp16["job_key"]
    now = files_state(out)
    assert all(now[name] == state for name, state in kept.items() if not name.endswith("manifest.json"))


def test_an_artifact_cache_serves_other_folders_and_keeps_passing_jobs_only(exported, no_load, tmp_path, monkeypatch):
    """`EDGEX_ARTIFACT_CACHE`: the module's export filed its passing job there; an export of the same
    job into a fresh folder takes it from there without loading the model, with the same bytes,
    marked reused; `--force` (`reuse_jobs=False`) looks nowhere; a damaged entry is a miss (removed,
    built again); a job with an entry that did not pass is never filed."""
    from edgex.artifacts.across import ENTRIES, ENV, ArtifactCache

    out, first = exported
    cache = out.parent / f"{out.name}-artifact-cache"
    (entry,) = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert entry.name == first["artifacts"][0]["job_key"] and (entry / ENTRIES).is_file()
    monkeypatch.setenv(ENV, str(cache))
    second = export_model("qwen3-tts", "cpu", tmp_path / "b", **ARGS)
    assert second["status"] == "pass" and second["source"] == first["source"]
    for made, reused in zip(first["artifacts"], second["artifacts"], strict=True):
        assert reused["reused"] is True and reused["reused_from"] == ENV and reused["files"] == made["files"]
        for record in reused["files"]:
            assert (tmp_path / "b/qwen3-tts/cpu" / record["path"]).read_bytes() == (out / "qwen3-tts/cpu" / record["path"]).read_bytes()
    with pytest.raises(Loaded):  # --force: built, not looked up
        export_model("qwen3-tts", "cpu", tmp_path / "c", reuse_jobs=False, **ARGS)

    store = ArtifactCache(tmp_path / "other")
    for verdict in ("fail", "unverified", "error"):
        store.add("k", [{**first["artifacts"][0], "verdict": verdict}], out / "qwen3-tts/cpu", {}, {})
        assert store.lookup("k") is None
    store.add("k", first["artifacts"], out / "qwen3-tts/cpu", {}, {})
    assert store.lookup("k") is not None

    onnx = entry / first["artifacts"][0]["files"][0]["path"]
    onnx.write_bytes(onnx.read_bytes()[:-1] + bytes([onnx.read_bytes()[-1] ^ 1]))
    with pytest.raises(Loaded):  # a flipped byte in the entry: a miss
        export_model("qwen3-tts", "cpu", tmp_path / "d", **ARGS)
    assert not entry.exists()
