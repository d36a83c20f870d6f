"""One meaning per option: an option that several commands take has the same name, short form and
help everywhere, and `--placement` adds a placement in every command (a pipeline, which runs one
artifact per stage, refuses a key given twice with two values instead of picking one silently)."""

from pathlib import Path

import pytest
import typer

from edgex.cli import app
from edgex.errors import EdgexError
from edgex.in_situ import _choose
from edgex.recipes import RECIPES


def _commands() -> dict:
    """Every leaf command by its path (`export`, `build run`, ...)."""
    root = typer.main.get_command(app)
    found = {}

    def walk(prefix, group):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                walk(f"{prefix}{name} ", command)
            else:
                found[f"{prefix}{name}"] = command
    walk("", root)
    return found


def _option(command, name: str):
    return next((p for p in command.params if p.name == name), None)


def test_shared_options_mean_the_same_in_every_command():
    commands = _commands()
    runners = ("export", "verify", "sweep", "pipeline", "build run")
    for name in runners:  # every command that runs toolchains can show their logs
        verbose = _option(commands[name], "verbose")
        assert verbose is not None and verbose.opts == ["--verbose", "-v"], name
    threads = {name: _option(commands[name], "threads") for name in ("export", "verify", "sweep", "pipeline")}
    assert len({(t.help, t.default) for t in threads.values()}) == 1, {n: (t.help, t.default) for n, t in threads.items()}
    min_db = {name: _option(commands[name], "min_db").help for name in ("export", "sweep")}
    assert len(set(min_db.values())) == 1
    for form in ("DB", "ROLE=DB", "PRECISION=DB", "ROLE:PRECISION=DB", "lowering=DB", "lowering:PRECISION=DB"):
        assert form in min_db["export"], form
    for name in ("export", "sweep", "build run", "build merge"):
        out = _option(commands[name], "out_dir")
        assert out.opts == ["--out", "-o"] and out.help.startswith("output root"), name
    placements = {name: _option(commands[name], "placement").help for name in ("export", "sweep", "pipeline")}
    assert all("KEY=EXPORTER:PRECISION[:CALIBRATION]" in h and "@FILE" in h for h in placements.values()), placements


def test_a_pipeline_refuses_a_key_placed_twice_and_accepts_a_repeat():
    recipe = RECIPES.facts("qwen3-tts")
    manifests = [(Path("folder"), {"target": "cpu", "artifacts": []})]
    with pytest.raises(EdgexError, match="--placement decoder is given twice"):
        _choose(manifests, recipe, ["code2latent"], ["decoder=onnx:fp16", "decoder=executorch:fp32"])
    with pytest.raises(EdgexError) as same:  # the same placement twice is one placement: nothing to refuse
        _choose(manifests, recipe, ["code2latent"], ["decoder=onnx:fp16", "decoder=onnx:fp16"])
    assert "given twice" not in str(same.value)
