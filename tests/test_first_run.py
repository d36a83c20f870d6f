"""A new user's first minutes: instant errors, edgex's own lines only, a plan before the work, a
progress display, and checkpoints found where users keep them."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import EDGEX, run_cli
from edgex.checkpoints import resolve_checkpoint
from edgex.errors import EdgexError

BAD_NAMES = [
    (["export", "nosuch", "--preset", "tiny"], "no such model 'nosuch'"),
    (["export", "qwen3-tts", "--target", "S25"], "no such target 'S25'"),
    (["export", "qwen3-tts", "--format", "tflite"], "no such format 'tflite'"),
    (["export", "qwen3-tts", "--precision", "int3"], "no such precision 'int3'"),
    (["export", "qwen3-tts", "--component", "vocoder"], "no such component 'vocoder'"),
    (["export", "qwen3-tts", "--preset", "huge"], "no such preset 'huge'"),
    (["export", "spark-x2.5", "--set", "windw=4"], "unknown option 'windw'"),
    (["export", "qwen3-tts", "--placement", "vocoder=onnx:fp32"], "no role 'vocoder'"),
]


def _timed_cli(*args: str) -> tuple[subprocess.CompletedProcess, float, float]:
    """The CLI in a fresh interpreter: (result, wall seconds, CPU seconds of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = run_cli(*args)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc, wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@pytest.mark.parametrize("args, fragment", BAD_NAMES, ids=[a[-1] if a[1] != "nosuch" else "model" for a, _ in BAD_NAMES])
def test_bad_names_fail_in_under_a_second(tmp_path, args, fragment):
    """Names are checked from light declarations: the CPU time is the interpreter, typer and rich,
    not torch. Wall time is printed too; on a machine shared by other jobs it can exceed CPU time."""
    proc, wall, cpu = _timed_cli(*args, "--out", str(tmp_path / "out"))
    print(f"{' '.join(args)}: {wall:.2f} s wall, {cpu:.2f} s CPU")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and fragment in proc.stderr
    assert cpu < 1.0, f"{cpu:.2f} s CPU for a bad name"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [["export", "nosuch"], ["list"], ["export", "qwen3-tts", "--dry-run"], ["--help"]])
def test_name_checks_list_and_help_import_no_heavy_stack(args):
    proc = subprocess.run([sys.executable, "-X", "importtime", *EDGEX[1:], *args], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=120)
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert imported, proc.stderr[-500:]
    assert not imported & {"torch", "transformers", "executorch", "onnx", "onnxruntime", "coremltools", "MNN"}


def test_list_explains_every_scheme_of_every_format():
    proc = run_cli("list", "--json")
    formats = json.loads(proc.stdout)["formats"]
    for name, row in formats.items():
        assert list(row["schemes"]) == row["precisions"], name
        assert all(meaning and "\n" not in meaning for meaning in row["schemes"].values())
    assert "computes in fp32" in formats["mnn"]["schemes"]["fp16"]
    text = run_cli("list").stdout
    assert "schemes per format" in text


def test_recipe_facts_are_what_the_implementation_uses():
    from edgex.recipes import RECIPES

    for name in RECIPES.names():
        recipe = RECIPES.get(name)
        assert recipe.facts is RECIPES.facts(name) and recipe.name == name


def test_dry_run_plans_without_building(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("export", "qwen3-tts", "--dry-run", "--json", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["source"] == {"preset": "tiny"} and plan["target"] == "cpu"
    # components x (pte, onnx) x (fp32, fp16), less what the recipe keeps off ExecuTorch: the unrolled
    # predictor (the runner loops the step graph there) and the vocoders' fp16 (code2wav, latent2wav)
    assert len(plan["jobs"]) == 7 * 2 * 2 - 2 - 2
    first = plan["jobs"][0]
    assert first["path"] == str(out / "qwen3-tts" / "cpu" / f"{first['component']}.{first['precision']}.pte")
    assert not out.exists()
    table = run_cli("export", "qwen3-tts", "-c", "code2wav", "-f", "onnx", "--dry-run", "--out", "o", cwd=tmp_path)
    assert table.returncode == 0 and "dry run" in table.stdout and "code2wav.fp16.onnx" in table.stdout, table.stdout
    assert table.stderr == "" and not (tmp_path / "o").exists()
    by_format = run_cli("export", "qwen3-tts", "-c", "code2wav", "-f", "pte", "--dry-run", "--json", "--out", "o", cwd=tmp_path)
    assert by_format.returncode == 0, by_format.stderr  # the format the table shows names its exporter
    assert {j["format"] for j in json.loads(by_format.stdout)["jobs"]} == {"executorch"}


_NOISY = """
import os, sys
from edgex.logs import native_output_quiet
with native_output_quiet() as stderr:
    os.write(1, b"native stdout\\n")
    os.write(2, b"native stderr\\n")
    print("python stderr", file=sys.stderr)
    print("edgex line", file=stderr)
print("json")
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_toolchain_output_is_silenced_at_the_descriptors_unless_verbose(verbose):
    env = dict(os.environ, EDGEX_VERBOSE="1" if verbose else "")
    proc = subprocess.run([sys.executable, "-c", _NOISY], capture_output=True, text=True, env=env, timeout=60)
    assert proc.stdout == "json\n"  # stdout stays for --json either way
    if verbose:
        assert proc.stderr.splitlines() == ["native stdout", "native stderr", "python stderr", "edgex line"]
    else:
        assert proc.stderr == "edgex line\n"


def test_progress_counts_jobs_and_estimates_from_recorded_costs(tmp_path):
    from rich.console import Console

    from edgex.plan import make_plan
    from edgex.progress import JobCosts, JobProgress

    plan = make_plan("qwen3-tts", "cpu", tmp_path, components=["talker_decode"], formats=["onnx"])
    costs = JobCosts(plan, tmp_path / "costs.json")
    first, second = plan.jobs
    costs.record({"seconds": 150.0,
                  "artifacts": [{"component": first.component, "exporter": "onnx", "precision": first.precision, "job_seconds": 40.0},
                                {"component": second.component, "exporter": "onnx", "precision": second.precision, "job_seconds": 80.0}]})
    costs = JobCosts(plan, tmp_path / "costs.json")  # read back from the file
    assert costs.get(second) == 80.0 and costs.setup == 30.0  # the run's wall time the jobs do not explain
    console = Console(file=(log := open(tmp_path / "log", "w")), width=160)
    with JobProgress(console, plan, 1, costs) as progress:
        assert 149 < progress._remaining() <= 150  # setup still ahead
        progress("loading model", None)
        progress(f"{first.component} -> onnx {first.precision}", first)
        progress(f"{first.component} onnx {first.precision}: pass", first)
        progress(f"{second.component} onnx {second.precision}: fail", second)
    log.close()
    lines = (tmp_path / "log").read_text().splitlines()
    assert lines[0] == "2 job(s) on 1 worker(s), about 2:30 in all by recorded costs"  # setup + jobs
    assert lines[1].startswith(f"[1/2] {first.component} onnx {first.precision}: pass  (0:00 elapsed, ~1:20 left)")
    assert lines[2].startswith(f"[2/2] {second.component} onnx {second.precision}: fail  (0:00 elapsed, ~0:00 left)")
    assert len(lines) == 3  # stage messages are not printed when piped


def test_piped_progress_names_a_setup_stage_that_lasts_and_stays_quiet_for_a_quick_one(tmp_path, monkeypatch):
    # A published-size model's load and references take minutes before the first job ends: a CI log
    # shows which stage it is in once the stage has lasted, and nothing for a stage that ends sooner.
    import time

    from rich.console import Console

    from edgex import progress as progress_module
    from edgex.plan import make_plan

    monkeypatch.setattr(progress_module, "STAGE_QUIET_S", 0.3)
    plan = make_plan("qwen3-tts", "cpu", tmp_path, components=["talker_decode"], formats=["onnx"])
    first = plan.jobs[0]
    console = Console(file=(log := open(tmp_path / "log", "w")), width=160)
    with progress_module.JobProgress(console, plan, 1, progress_module.JobCosts(plan, tmp_path / "costs.json")) as progress:
        progress("loading qwen3-tts (tiny)", None)  # followed at once: no line
        progress("building talker_decode from the eager pipeline", None)
        time.sleep(1.0)
        progress(f"{first.component} -> onnx {first.precision}", first)
        progress(f"{first.component} onnx {first.precision}: pass", first)
        progress("building code2wav from the eager pipeline", None)  # the run ends first: no line
    time.sleep(0.6)
    log.close()
    lines = (tmp_path / "log").read_text().splitlines()
    assert lines[0].startswith("2 job(s) on 1 worker(s)")
    assert lines[1] == "building talker_decode from the eager pipeline  (0:00 elapsed)"
    assert lines[2].startswith(f"[1/2] {first.component} onnx {first.precision}: pass")
    assert len(lines) == 3


def _fake_hub_cache(root: Path, repo_id: str, commit: str, files: dict[str, bytes]) -> Path:
    """The layout huggingface_hub writes: blobs, a snapshot of symlinks per commit, refs/main."""
    repo = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for i, (name, data) in enumerate(files.items()):
        blob = repo / "blobs" / f"blob{i}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).symlink_to(os.path.relpath(blob, (snapshot / name).parent))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_hub_id_resolves_from_the_local_cache_only(tmp_path, monkeypatch):
    snapshot = _fake_hub_cache(tmp_path / "hub", "Org/Tiny-TTS", "abc123", {"config.json": b"{}", "speech_tokenizer/config.json": b"{}"})
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_checkpoint("Org/Tiny-TTS") == snapshot
    assert resolve_checkpoint("Org/Tiny-TTS@abc123") == snapshot  # a commit hash
    assert (resolve_checkpoint("Org/Tiny-TTS") / "speech_tokenizer" / "config.json").read_bytes() == b"{}"
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # HF_HOME/hub
    assert resolve_checkpoint("Org/Tiny-TTS") == snapshot
    with pytest.raises(EdgexError, match=r"nor in the local Hugging Face cache \(looked for .*models--Org--Other/refs/main"):
        resolve_checkpoint("Org/Other")
    with pytest.raises(EdgexError, match="does not exist"):
        resolve_checkpoint(tmp_path / "no" / "such" / "folder")


def test_cli_takes_a_hub_id_and_never_downloads(tmp_path):
    snapshot = _fake_hub_cache(tmp_path / "hub", "Org/Tiny-TTS", "abc123", {"config.json": b"{}"})
    env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), PYTHONWARNINGS="ignore")
    run = lambda *a: subprocess.run([*EDGEX, *a], capture_output=True, text=True, env=env, timeout=300)  # noqa: E731
    proc = run("export", "qwen3-tts", "--checkpoint", "Org/Tiny-TTS", "--dry-run", "--json", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["source"] == {"checkpoint": str(snapshot)}
    miss = run("export", "qwen3-tts", "--checkpoint", "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice", "--out", str(tmp_path / "o"))
    assert miss.returncode == 2 and miss.stderr.count("\n") == 1
    assert str(tmp_path / "hub" / "models--Qwen--Qwen3-TTS-12Hz-0.6B-CustomVoice" / "refs" / "main") in miss.stderr


def _tracked_files() -> list[Path]:
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=root)
    if proc.returncode != 0:
        pytest.skip("not a git checkout")
    return [root / name for name in proc.stdout.decode().split("\0") if name]


def test_the_repository_stands_on_its_own():
    """No committed binaries (the project has none it uses), and every document the code or README
    cites lives in the repository (`docs/`), not in a folder beside it."""
    files = _tracked_files()
    binaries = [f.name for f in files if f.is_file() and b"\0" in f.read_bytes()[:8192]]
    assert not binaries
    text = {f: f.read_text(errors="replace") for f in files if f.suffix in (".py", ".md", ".toml") or f.name in ("setup", "run")}
    stale = [f"{f.name}: {word}" for f, t in text.items() for word in ("MODELS.md", "DESIGN.md", "../shared", "shared/")
             if word in t and f.name != Path(__file__).name]
    assert not stale
    root = Path(__file__).resolve().parent.parent
    for f, t in text.items():
        for cited in set(re.findall(r"docs/[\w.-]+\.md", t)):
            assert (root / cited).is_file(), f"{f.name} cites {cited}"
