"""Shared fixtures: the tiny preset built once, and one real CPU export run through the CLI.

The suite runs under pytest-xdist (`--dist loadgroup`): tests that share an expensive module or
session fixture carry one `xdist_group`, so that fixture is built on one worker only."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

import edgex  # noqa: F401  (first: lets torchvision, which transformers imports, load beside CPU torch)

EDGEX = [sys.executable, "-m", "edgex"]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([*EDGEX, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=3600)


def cli_here(*args: str) -> subprocess.CompletedProcess:
    """The CLI's own entry point (`edgex.cli.app`, what `python -m edgex` runs) in this test process,
    as `run_cli` returns it: for a test of what a command writes and decides, not of its process (a
    fresh interpreter's imports and exporter warm-up cost each `run_cli` about 6 s). An exception the
    CLI lets out fails the test with its traceback."""
    from typer.testing import CliRunner

    from edgex.cli import app

    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["edgex", *args], result.exit_code, result.stdout, result.stderr)


# The CLI records each job's cost for its next progress estimate: tests keep theirs out of the
# user's cache, in one folder per run, made by the process that imports this file first (pytest, or
# xdist's controller: its workers inherit the variable) and removed by it when the session ends.
_CACHE_DIR = None
if "EDGEX_CACHE_DIR" not in os.environ:
    _CACHE_DIR = os.environ["EDGEX_CACHE_DIR"] = tempfile.mkdtemp(prefix="edgex-test-cache-")

# Builds that tests of several modules or several workers share (`built_once`) go in one folder per
# run, made and removed the same way.
_SHARED_DIR = None
if "EDGEX_TESTS_SHARED_DIR" not in os.environ:
    _SHARED_DIR = os.environ["EDGEX_TESTS_SHARED_DIR"] = tempfile.mkdtemp(prefix="edgex-test-shared-")

MAX_WORKERS = 4  # each worker holds torch and the tiny models, and exports spawn their own processes
if os.environ.get("PYTEST_XDIST_WORKER"):
    # The workers already fill the cores: with a thread pool each (inherited by the CLI subprocesses),
    # OpenMP threads spin against each other (measured: a quarter more CPU time, no faster).
    os.environ.setdefault("OMP_NUM_THREADS", "1")


# Test files whose exports may reuse, job by job, what another test's export of the same job (same
# key: edgex source, model, weights, job, gates) left in this run's artifact cache
# (`EDGEX_ARTIFACT_CACHE`, edgex/artifacts/across.py), so the tiny exports that many files make are
# built once a run. Left out: files that change edgex's or a library's code in the test process
# before they export (a planted graph bug, a runtime declared missing or fp16-accumulating, a counted
# or failing writer), since the key does not see such a change, and the files that test the
# reuse, builds and their caches themselves. A test of a listed file that plants a change of its own
# carries `@pytest.mark.builds_afresh`.
SHARES_EXPORTS = ("checkpoint", "command_chain", "contract", "export_cpu", "fault_injection", "gguf", "gguf_mmproj", "hub",
                  "minicpm_o", "official_utterance", "pi0", "pipeline", "policy_configs", "streaming", "verify", "vla",
                  "voice_prompt")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Set or clear `EDGEX_ARTIFACT_CACHE` for the whole of this test, its fixtures' set-up (the
    first test of a module builds the module's fixtures) and the CLI processes it starts."""
    shares = item.path.stem.removeprefix("test_") in SHARES_EXPORTS and item.get_closest_marker("builds_afresh") is None
    if shares:
        os.environ["EDGEX_ARTIFACT_CACHE"] = str(Path(os.environ["EDGEX_TESTS_SHARED_DIR"]) / "artifact-cache")
    else:
        os.environ.pop("EDGEX_ARTIFACT_CACHE", None)


def pytest_sessionfinish(session, exitstatus):
    """xdist's controller gets here after its workers have finished theirs."""
    for folder in (_CACHE_DIR, _SHARED_DIR):
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


# Every test file sits in one layer; `pytest -m LAYER` runs one (docs/testing.md says what each
# checks and how long it takes). A file in no layer, or in two, stops the collection.
LAYERS = {
    "logic": ("planners, keys, reports, parsers, scoring rules, CLI errors and layout rules, on toy "
              "inputs, stand-in models or recorded manifests: no export",
              ["build_plan", "catalog", "cli_errors", "cli_options", "coarse_verdicts", "component_builder", "docs",
               "first_run", "gate_outcomes", "half_arithmetic", "import_circles", "knowledge_layout", "mapped_weights",
               "memory_needs", "metrics", "qwen3_tts_runner", "ray_batches", "scheduler", "side_by_side", "spectral_gate",
               "task_figures", "tie_rule"]),
    "graphs": ("each recipe's eager graphs and wrappers against the model's own published code, and the "
               "samples parity runs, before any exporter",
               ["hift_verdicts", "minicpm_o", "pi0", "rope_table", "samples_cover", "utterance_replay", "vla", "wrappers"]),
    "artifacts": ("real exports run in their real runtimes, one per format and precision a target places by "
                  "default: a broken artifact fails its gate, a faithful one passes; contracts, pipelines, "
                  "checkpoints in published layouts",
                  ["checkpoint", "coarse_schemes", "contract", "coreml", "coreml_interpreter", "executorch_lowering",
                   "export_cost", "export_cpu", "fault_injection", "gate", "gguf", "gguf_mmproj", "gguf_vocab", "hub", "manifest",
                   "minicpm_o_stream", "mnn", "nonfinite", "norm_quantization", "official_utterance", "onnx_fusions",
                   "patches", "pipeline", "planted_graph", "policy_configs", "predictor_gate", "qdq_lowering", "qnn", "qnn_tables",
                   "quantized", "sampling_quantization", "scheme", "spark", "streaming", "unverified", "verify",
                   "voice_prompt"]),
    "commands": ("commands on what other commands wrote and under faults: builds, sweeps, the cache, "
                 "executors (local and Ray), killed and interrupted runs, temporary files",
                 ["build", "build_faults", "build_local", "build_ray", "command_chain", "export_cache", "export_workers",
                  "sweep", "temp_files"]),
}


def pytest_configure(config):
    for layer, (what, _) in LAYERS.items():
        config.addinivalue_line("markers", f"{layer}: {what}")
    config.addinivalue_line("markers", "builds_afresh: a test of a SHARES_EXPORTS file that changes code before it exports")
    # Here as well as at collection: under xdist only the workers collect, and a worker's usage
    # error ends it with no message the run shows ("no tests ran").
    check_layers(Path(__file__).parent)


def check_layers(folder: Path) -> None:
    """Every `test_*.py` in `folder` in exactly one layer, else a usage error naming the file."""
    for path in sorted(folder.glob("test_*.py")):
        layer_of(path)


def layer_of(path: Path) -> str:
    """The one layer `tests/test_NAME.py` belongs to; a usage error where it is in none or several."""
    name = path.stem.removeprefix("test_")
    layers = [layer for layer, (_, files) in LAYERS.items() if name in files]
    if len(layers) != 1:
        raise pytest.UsageError(f"{path.name} is in {len(layers)} layers of tests/conftest.py LAYERS; put it in one")
    return layers[0]


def pytest_xdist_auto_num_workers(config):
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


@pytest.hookimpl(tryfirst=True)  # before xdist turns the marks into scheduling groups
def pytest_collection_modifyitems(config, items):
    """Every test gets its layer's mark; every test that uses the README-demo export runs on the
    worker that built it."""
    for item in items:
        item.add_marker(getattr(pytest.mark, layer_of(item.path)))
        if "cpu_export" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("cpu_export"))


def built_once(name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name` of this run's shared builds, filled by `make(folder)` in the first process
    that asks for it; any other xdist worker waits for that build and reuses it. A module fixture
    whose tests xdist spreads over both workers then builds its export once, not once per worker.
    A `make` that raises leaves no folder behind: the next process that asks builds it again."""
    from filelock import FileLock

    shared = Path(os.environ["EDGEX_TESTS_SHARED_DIR"])
    folder, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            try:
                make(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            done.touch()
    return folder


# A build file of one tiny job (talker_decode, ONNX fp32, one thread): the build tests' smallest plan.
ONE_JOB_BUILD = """
[build]
threads = 1

[[entry]]
model = "qwen3-tts"
targets = ["cpu"]
components = ["talker_decode"]
formats = ["onnx"]
precisions = ["fp32"]
"""


@pytest.fixture
def fresh_tempdir(tmp_path, monkeypatch):
    """An empty temporary folder for this test, for Python's `tempfile` here and in forked children
    (`tempfile.tempdir`) and for the tools they start (`TMPDIR`): a test of what is left in temp
    looks at it alone."""
    folder = tmp_path / "temp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


@pytest.fixture(scope="session")
def tiny():
    """The tiny qwen3-tts preset and all its components (samples from the eager pipeline)."""
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    loaded = recipe.load("tiny", None, 0)
    return loaded, {c.name: c for c in recipe.components(loaded)}


# The suite's CPU export is the README demo less four kinds of build: the ExecuTorch builds of the
# 15-step code predictor frame and its ONNX fp16 build (XNNPACK's lowering of the unrolled frame is
# about 4 CPU-minutes per precision; ONNX fp16 of the frame is gated in test_predictor_gate.py), the
# ExecuTorch fp16 builds of the decoders (a quarter of what is left: XNNPACK lowers their convs
# slowly, and fp16 ExecuTorch is exercised by the talker decode and predictor step), the ExecuTorch
# fp16 build of the talker prefill (the same exporter and precision as the talker decode's), and
# the ExecuTorch build of code2wav (the slowest program left, 28 job-seconds: its two streaming
# halves, code2latent and latent2wav, are the decoder's .pte programs here). The whole demo is
# `test_readme_demo_exports_every_component` in test_export_cpu.py, a benchmark.
CPU_EXPORT_PLACEMENTS = ("code_predictor=onnx:fp32", "decoder=onnx:fp32", "decoder=onnx:fp16", "decoder=executorch:fp32",
                         "code2wav=onnx:fp32", "code2wav=onnx:fp16",
                         "talker_prefill=executorch:fp32", "talker_prefill=onnx:fp32", "talker_prefill=onnx:fp16")


def cpu_export_artifacts(roles: dict[str, str]) -> set[tuple[str, str, str]]:
    """(component, format, precision) of every artifact the suite's CPU export writes (the
    components an export builds unless named: not qwen3-tts's on-request voice-prompt graphs)."""
    from edgex.recipes.qwen3_tts.facts import ON_REQUEST

    full = {(c, f, p) for c in roles if c not in ON_REQUEST for f in ("pte", "onnx") for p in ("fp32", "fp16")}
    left_out = {("code_predictor", "pte", "fp32"), ("code_predictor", "pte", "fp16"), ("code_predictor", "onnx", "fp16")}
    left_out |= {(c, "pte", "fp16") for c, role in roles.items() if role == "decoder"}
    left_out |= {("talker_prefill", "pte", "fp16"), ("code2wav", "pte", "fp32")}
    return full - left_out


def export_cpu(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_cli("export", "qwen3-tts", "--target", "cpu", "--preset", "tiny", "--out", str(out), "--json", "--jobs", "2",
                   *extra)


def shared_cli(name: str, command: Callable[[Path], subprocess.CompletedProcess]) -> tuple[Path, subprocess.CompletedProcess]:
    """`command(folder)` (a CLI run writing into `folder`) run once per test run for every module and
    worker that asks for `name` (`built_once`): (folder, the CLI's completed process)."""

    def make(out: Path) -> None:
        proc = command(out)
        record = {"args": proc.args, "returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
        (out / "cli.json").write_text(json.dumps(record))

    out = built_once(name, make)
    record = json.loads((out / "cli.json").read_text())
    return out, subprocess.CompletedProcess(record["args"], record["returncode"], record["stdout"], record["stderr"])


def subset_folder(source: Path, keep: Callable[[dict], bool], folder: Path) -> tuple[Path, dict]:
    """A copy in `folder` of the export folder `source` holding only the manifest entries `keep`
    accepts and their files: a test that changes files works on its own copy of a shared export."""
    manifest = json.loads((source / "manifest.json").read_text())
    manifest["artifacts"] = [a for a in manifest["artifacts"] if keep(a)]
    for record in (r for a in manifest["artifacts"] for r in a["files"]):
        (folder / record["path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / record["path"], folder / record["path"])
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return folder, manifest


# The MNN target's suite export (tests/test_mnn.py): a KV-cache decode graph, a sampling frame graph
# and a convolutional decoder, each MNN lowering path once; its talker_decode is also the one
# tests/test_fault_injection.py corrupts. The decode graph and the decoder at both default precisions,
# the frame in fp32 alone (`MNN_PLACEMENTS`): its conversion is the export's slowest job; the frame's
# MNN fp16 build is in test_mnn.py's every-component benchmark.
MNN_COMPONENTS = ("talker_decode", "code_predictor", "code2latent")
MNN_PLACEMENTS = ("code_predictor=mnn:fp32",)


def mnn_export() -> tuple[Path, subprocess.CompletedProcess]:
    return shared_cli("mnn-export", lambda out: run_cli("export", "qwen3-tts", "--target", "mnn", "--preset", "tiny", "--out", str(out),
                                                        "--json", "--jobs", "2", "-c", ",".join(MNN_COMPONENTS),
                                                        "--placement", ",".join(MNN_PLACEMENTS)))


# The llama-cpp target's export at three precisions (tests/test_gguf.py; q4_0 by name:
# talker_prefill's is declared too coarse, so no default places it); tests/test_fault_injection.py
# corrupts its talker_decode files.
GGUF_PRECISIONS = ("f16", "q8_0", "q4_0")


def gguf_export() -> tuple[Path, subprocess.CompletedProcess]:
    return shared_cli("gguf-export", lambda out: run_cli("export", "qwen3-tts", "--target", "llama-cpp", "--preset", "tiny", "-p",
                                                         ",".join(GGUF_PRECISIONS), "-c", "talker_prefill,talker_decode", "--out", str(out),
                                                         "--json"))


@pytest.fixture(scope="session")
def cpu_export():
    """The README demo (`edgex export qwen3-tts --target cpu --preset tiny`) in two worker processes
    (CI has 2 cores; the artifacts are the same as with one), placed as `CPU_EXPORT_PLACEMENTS` says:
    (out, the CLI's completed process). Built once for every xdist worker."""
    return shared_cli("cpu-export", lambda out: export_cpu(out, "--placement", ",".join(CPU_EXPORT_PLACEMENTS)))
