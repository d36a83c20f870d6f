"""Every command on what the command before it wrote, per recipe, each with its default output
folder: every step ends in a verdict (exit 0 pass, 1 fail, 3 incomplete) or in one `edgex: ...`
line (exit 2), never a traceback.

Each recipe gets one job (one component as ONNX fp32: the smallest plan whose folders every reader
still reads). In one working folder, `edgex build run` of a file holding every recipe's job writes
`out/MODEL/cpu` and its cache `out/.edgex-cache` (the one real export of each job); then per recipe:

1. `edgex verify` and `edgex pipeline` of the build's folder;
2. `edgex sweep` of the job, given the build's cache (its folder `out/sweep/MODEL/cpu`, published
   by the build's code), and `edgex pipeline` of that folder;
3. `edgex export` of the job, whose default output is the build's folder: it keeps the build's
   artifact, job by job, and writes its own manifest; `edgex verify` and `edgex pipeline` of it;
4. `edgex build run` of the recipe's entry over the export's folder, and `edgex pipeline` of it.

Each writer and each verify must pass (the job is a faithful fp32 graph); `edgex pipeline` runs the
recipe's in-situ pipeline or says in one line why it cannot (a stage not exported, no in-situ
pipeline for the recipe).

The commands run in this process (typer's runner; export jobs fork from it), so no step pays for a
new interpreter; an exception escaping a command is what a user would see as a traceback.
`benchmarks/bench_command_chain.py` walks every default plan the same way; qwen3-tts's
`edgex voice-prompt` chain (a checkpoint, its voice prompt, an export of the checkpoint, the
pipeline speaking with that voice) is `tests/test_voice_prompt.py`'s."""

from __future__ import annotations

import contextlib
import traceback

import pytest
from typer.testing import CliRunner

from edgex.cli import app
from edgex.recipes import RECIPES

pytestmark = pytest.mark.xdist_group("command_chain")  # the tests read the module's one build

# recipe -> the component its chain exports (ONNX fp32, tiny preset): the one cheapest to export and verify
JOBS = {"qwen3-tts": "code_predictor_step", "minicpm-o": "tts_decode", "spark-x2.5": "decode", "act": "policy",
        "diffusion-policy": "vision_encoder", "smolvla": "vision_encoder", "pi0": "vision_encoder"}
CACHE = "out/.edgex-cache"  # edgex build's default cache for its default output
VERDICTS = {0: "pass", 1: "fail", 3: "incomplete"}


def entry(model: str) -> str:
    return (f'[[entry]]\nmodel = "{model}"\ntargets = ["cpu"]\ncomponents = ["{JOBS[model]}"]\n'
            'formats = ["onnx"]\nprecisions = ["fp32"]\n\n')


def outcome(argv: list[str]) -> str:
    """Run one command; its verdict, or its one `edgex:` line. Fails the test on a traceback, an
    unknown exit code or an exit 2 that is not one `edgex:` line (the last the command printed)."""
    result = CliRunner().invoke(app, argv)
    command = "edgex " + " ".join(argv)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        trace = "".join(traceback.format_exception(result.exception))
        pytest.fail(f"{command} traced back:\n{trace[-3000:]}")
    assert "Traceback (most recent call last)" not in result.output, f"{command}:\n{result.output[-3000:]}"
    if result.exit_code == 2:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("edgex: ")]
        assert len(errors) == 1 and lines[-1] == errors[0], f"{command}: exit 2 without one edgex: line\n{result.stderr[-3000:]}"
        return errors[0]
    assert result.exit_code in VERDICTS, f"{command}: exit {result.exit_code}\n{result.output[-3000:]}"
    return VERDICTS[result.exit_code]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The working folder after `edgex build run build.toml`: every recipe's job, default output."""
    root = tmp_path_factory.mktemp("chain")
    (root / "build.toml").write_text("".join(entry(model) for model in JOBS))
    with contextlib.chdir(root):
        assert outcome(["build", "run", "build.toml"]) == "pass"
    return root


def test_jobs_name_every_recipe():
    assert set(JOBS) == set(RECIPES.names())


@pytest.mark.parametrize("model", list(JOBS))
def test_each_command_reads_what_the_one_before_wrote(model, built, monkeypatch):
    monkeypatch.chdir(built)
    job, folder = ["-c", JOBS[model], "-f", "onnx", "-p", "fp32"], f"out/{model}/cpu"

    assert outcome(["verify", folder]) == "pass"
    outcome(["pipeline", model, folder])
    assert outcome(["sweep", model, *job, "--cache", CACHE]) == "pass"
    outcome(["pipeline", model, f"out/sweep/{model}/cpu"])
    assert outcome(["export", model, *job]) == "pass"
    assert outcome(["verify", folder]) == "pass"
    outcome(["pipeline", model, folder])
    (built / f"{model}.toml").write_text(entry(model))
    assert outcome(["build", "run", f"{model}.toml"]) == "pass"
    outcome(["pipeline", model, folder])
