"""The docs stay true: every `edgex` command line in README.md and docs/ parses with the CLI's own
parser and names only models, targets, components, formats, presets and precisions that exist;
every relative link and referenced repository file exists; and no file speaks of the repository's
development history (when and by whom something was done, tracker numbers, scratch paths, the
names of lock files used while developing).

The checks are plain functions so that the last test can show each one failing on planted input."""

from __future__ import annotations

import io
import re
import shlex
import tokenize
from pathlib import Path

import pytest
import typer

from edgex.artifacts.lock import LOCK_NAME
from edgex.build.spec import load_plan
from edgex.cli import app
from edgex.plan import make_plan, placement_overrides
from edgex.recipes import RECIPES
from edgex.sweep.plan import sweep_jobs

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Where history must not appear: the user's docs, the code, its tests, scripts and build files.
SCANNED = [*DOCS, *sorted(p for d in ("edgex", "tests", "scripts", "benchmarks", "builds") for p in (ROOT / d).rglob("*")
                          if p.suffix in (".py", ".md", ".toml") and "__pycache__" not in p.parts), ROOT / "scripts" / "setup"]

# Each pattern is written so that its own source text does not match it (a character class breaks
# the word), so this file is scanned like any other.
HISTORY = {
    "a period of work": re.compile(r"\bs[e]ssions?[ -]?\d|\b(?:this|that|last|earlier|previous|next|other|another) s[e]ssions?\b"
                                  r"|\bs[e]ssions'|\brounds? of w[o]rk\b", re.I),
    "someone who worked on it": re.compile(r"(?<![\w.])h[e]lpers?(?![\w.(])", re.I),
    "a tracker number": re.compile(r"\bi[s]sues? #?\d+", re.I),
    "a working copy": re.compile(r"\bw[o]rktrees?\b", re.I),
    "a scratch or home path": re.compile(r"(?<![\w.~-])/(?:t[m]p|h[o]me|r[o]ot|w[o]rk)/"),
    # edgex's own output-folder lock is a product file; any other lock file is a development one
    "a lock-file name": re.compile(rf"(?<![\w.-])(?!{re.escape(LOCK_NAME.lstrip('.'))}\b)[\w-]+\.l[o]ck\b"),
}

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A repository path in backquotes: `edgex/cli.py`, `tests/test_x.py::test_y`, `builds/ci.toml`.
REPO_PATH = re.compile(r"`((?:edgex|tests|scripts|builds|benchmarks|docs|\.github)/[\w./-]+)(?:::(\w+))?`")
FENCE = re.compile(r"^```(\w*)\s*$")


def _doc_text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def command_lines(text: str) -> list[str]:
    """The `edgex ...` invocations in a markdown file's code blocks, continuation lines joined,
    trailing comments, environment prefixes and the `.venv/bin/` prefix removed."""
    lines, block, joined = [], None, ""
    for raw in text.splitlines():
        fence = FENCE.match(raw.strip())
        if fence:
            block = None if block is not None else fence.group(1)
            continue
        if block is None or block not in ("", "bash", "sh", "console"):
            continue
        joined += raw.rstrip()
        if joined.endswith("\\"):
            joined = joined[:-1] + " "
            continue
        line, joined = joined, ""
        for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line.split(" #", 1)[0] if not line.lstrip().startswith("#") else ""):
            words = part.split()
            while words and (re.fullmatch(r"\w+=\S*", words[0]) or words[0] in ("/usr/bin/time", "-v", "nice", "env", "flock")):
                words = words[1:]
            if words and re.fullmatch(r"(?:\S*/)?edgex", words[0]):
                lines.append(" ".join(["edgex", *words[1:]]))
            elif words[:3] and re.fullmatch(r"(?:\S*/)?python3?", words[0]) and words[1:3] == ["-m", "edgex"]:
                lines.append(" ".join(["edgex", *words[3:]]))
    return lines


def parse(line: str) -> tuple[list[str], dict]:
    """The subcommand path and its parameters as the CLI's own click parser reads `line`; runs nothing."""
    group = typer.main.get_command(app)
    args = shlex.split(line)[1:]
    ctx = group.make_context("edgex", args)
    names, command = [], group
    while hasattr(command, "resolve_command"):  # a group (typer ships its own click)
        rest = [*getattr(ctx, "protected_args", ctx._protected_args), *ctx.args]
        if not rest:
            raise ValueError(f"{line!r} names no command")
        # The group's own parse_args may rewrite the arguments (`edgex build FILE` runs `build run`).
        name, command, rest = command.resolve_command(ctx, rest)
        names.append(name)
        ctx = command.make_context(name, rest, parent=ctx)
    return names, ctx.params


def _names(values) -> list[str] | None:
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()] or None


def check_command(line: str) -> None:
    """Parse `line` and check every name in it against the registries (raises on a bad one)."""
    names, params = parse(line)
    placements = [p for p in _names(params.get("placement")) or [] if not p.startswith("@")]
    if names == ["export"]:
        make_plan(params["model"], params["target"], Path("out"), preset=params["preset"], components=_names(params["component"]),
                  formats=_names(params["fmt"]), precisions=_names(params["precision"]), placements=placements,
                  calibration_size=params["calibration"])
    elif names == ["sweep"]:
        sweep_jobs(params["model"], params["target"], preset=params["preset"], components=_names(params["component"]),
                   formats=_names(params["fmt"]), precisions=_names(params["precision"]), placements=placements,
                   calibrations=[int(c) for c in _names(params["calibration"]) or []] or None)
    elif names == ["pipeline"]:
        placement_overrides(RECIPES.facts(params["model"]), placements)
    elif names[:1] == ["build"] and names[1:] == ["run"]:
        load_plan(ROOT / params["file"])


def broken_references(path: Path, text: str) -> list[str]:
    """Relative links whose target is missing, and backquoted repository paths (and test names)
    that do not exist."""
    problems = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#", 1)[0]).exists():
            problems.append(f"{path.name}: link {target} does not exist")
    for ref, test in REPO_PATH.findall(text):
        file = ROOT / ref
        if not file.exists():
            problems.append(f"{path.name}: `{ref}` does not exist")
        elif test and not re.search(rf"^def {test}\(", file.read_text(encoding="utf-8"), re.M):
            problems.append(f"{path.name}: `{ref}::{test}` names no test there")
    return problems


def prose(path: Path, text: str) -> list[tuple[int, str]]:
    """What a reader reads: a markdown or build file whole; a Python file's comments and strings
    (identifiers such as `onnx.helper` are code, not prose)."""
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return [(t.start[0], t.string) for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING)
            or t.type == getattr(tokenize, "FSTRING_MIDDLE", -1)]


def history(path: Path, text: str) -> list[str]:
    found = []
    for line, chunk in prose(path, text):
        for what, pattern in HISTORY.items():
            for match in pattern.finditer(chunk):
                found.append(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{line}: "
                             f"{match.group(0)!r} ({what})")
    return found


def test_every_command_line_in_the_docs_parses_and_names_what_exists():
    lines = [(path, line) for path in DOCS for line in command_lines(_doc_text(path))]
    assert len(lines) >= 15, lines  # the README alone shows ten
    problems = []
    for path, line in lines:
        try:
            check_command(line)
        except Exception as exc:  # noqa: BLE001 - a usage error or an EdgexError: report each with its line
            problems.append(f"{path.name}: {line}\n    {type(exc).__name__}: {exc}")
    assert not problems, "\n".join(problems)


def test_every_link_and_referenced_file_exists():
    problems = [p for path in DOCS for p in broken_references(path, _doc_text(path))]
    assert not problems, "\n".join(problems)


def test_nothing_speaks_of_development_history():
    found = [f for path in SCANNED for f in history(path, path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def test_the_checks_fail_on_planted_history_a_broken_link_and_a_bad_command(tmp_path):
    readme = _doc_text(ROOT / "README.md")
    page = tmp_path / "page.md"
    planted = readme + "\nMeasured in " + "ses" + "sion 12 under " + "/t" + "mp/x/out.\n"
    assert history(page, planted) and not history(page, readme)
    code = tmp_path / "x.py"
    name = "hel" + "per"
    assert history(code, f'"""Fixed in {"iss" + "ue"} 16."""\nfrom onnx import {name}\n') and not history(code, f"from onnx import {name}\n")
    broken = readme + "\nSee [the guide](docs/" + "no-such-page.md) and `edgex/no_such_module.py`.\n"
    assert len(broken_references(ROOT / "README.md", broken)) == 2 and not broken_references(ROOT / "README.md", readme)
    for bad in ("edgex export qwen3-tts --target S25", "edgex export qwen3-tts -c talker", "edgex sweep qwen3-tts -p fp17",
                "edgex export qwen3-tts --no-such-flag", "edgex pipeline qwen3-tts out --placement vocoder=onnx:fp32"):
        with pytest.raises(Exception):
            check_command(bad)
    check_command("edgex export qwen3-tts --target s25-htp -c talker_decode -p w8a16")


def readme_commands() -> tuple[str, str]:
    """The README's set-up command (the first word pair of its first command line) and its test command."""
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    setup = blocks[0].strip().split(" && ")[0]
    test = blocks[1].strip()
    return setup, test


def test_ci_and_the_tests_workflow_run_the_readme_s_two_commands():
    """What CI gates on is what the README tells a contributor to run: `.ci/run` and the GitHub tests
    workflow each run the README's set-up and then its test command (extra pytest reporting options
    aside)."""
    setup, test = readme_commands()
    assert setup == "bash scripts/setup" and test.startswith(".venv/bin/python -m pytest"), (setup, test)
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert ci.index(setup) < ci.index(test)
    import yaml

    steps = yaml.safe_load((ROOT / ".github" / "workflows" / "edgex-tests.yml").read_text())["jobs"]["tests"]["steps"]
    runs = [step.get("run", "").strip() for step in steps]
    assert setup in runs
    assert any(run == test or run.startswith(test + " --") for run in runs[runs.index(setup) + 1:]), runs


def test_docs_testing_names_every_layer_and_a_file_in_none_stops_the_collection(tmp_path):
    """docs/testing.md's layer table is the conftest's, file counts included; a test file in no layer is
    a collection error, not a test that no layer runs."""
    from conftest import LAYERS, check_layers, layer_of

    rows = dict(re.findall(r"^\| `(\w+)` \|[^|]+\| (\d+) \|", (ROOT / "docs" / "testing.md").read_text(), re.M))
    assert rows == {layer: str(len(files)) for layer, (_, files) in LAYERS.items()}
    on_disk = {p.stem.removeprefix("test_") for p in (ROOT / "tests").glob("test_*.py")}
    assert on_disk == {name for _, files in LAYERS.values() for name in files}
    assert layer_of(ROOT / "tests" / "test_docs.py") == "logic"
    with pytest.raises(pytest.UsageError, match="test_nowhere.py is in 0 layers"):
        layer_of(ROOT / "tests" / "test_nowhere.py")
    check_layers(ROOT / "tests")
    (tmp_path / "test_docs.py").write_text("")
    (tmp_path / "test_nowhere.py").write_text("")
    with pytest.raises(pytest.UsageError, match="test_nowhere.py is in 0 layers"):
        check_layers(tmp_path)
