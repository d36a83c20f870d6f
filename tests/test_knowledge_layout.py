"""Model knowledge lives in recipes: targets place roles and precisions, the build machinery and the
exporters are format and job knowledge. A new model adds its own folder and edits nothing central."""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import replace
from pathlib import Path

import pytest

from edgex.errors import EdgexError
from edgex.plan import plan
from edgex.recipes import RECIPES
from edgex.recipes.base import ComponentPrecisions
from edgex.targets import ROLES, TARGETS

PACKAGE = Path(__file__).resolve().parents[1] / "edgex"
CENTRAL = [PACKAGE / "targets.py", *sorted((PACKAGE / "build").rglob("*.py")), *sorted((PACKAGE / "exporters").rglob("*.py"))]
# Component names that are also plain English words: flagged only as a whole string literal (a
# placement key), or in capitals as a model's name (ACT), not as a word in prose or an API name.
WORDS = {"act", "policy", "flow", "decode", "prefill"}


def _names() -> set[str]:
    roles = {role for _, facts in RECIPES.all_facts() for role in facts.components.values()}
    names = set()
    for model, facts in RECIPES.all_facts():
        names.add(model)
        names.update(facts.components)
    return names - roles


def _pattern(name: str) -> re.Pattern:
    spelled = re.escape(name).replace(r"\-", "[- ]")  # diffusion-policy, Diffusion Policy
    return re.compile(rf"(?<![\w.-]){spelled}(?![\w-])", re.IGNORECASE)


def mentions(text: str, names: set[str]) -> list[tuple[int, str, str]]:
    """(line, name, text) for each recipe name in a string literal or comment of Python source."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in (tokenize.STRING, tokenize.COMMENT):
            continue
        for name in sorted(names):
            if name in WORDS:
                hit = token.string.strip("'\"") == name or re.search(rf"\b{re.escape(name.upper())}\b", token.string)
            else:
                hit = _pattern(name).search(token.string)
            if hit:
                found.append((token.start[0], name, token.string.splitlines()[0][:100]))
    return found


def test_targets_build_and_exporters_name_no_model_or_component():
    names = _names()
    assert {"qwen3-tts", "hift", "action_step", "talker_decode"} <= names  # the registry was read
    hits = [f"{path.relative_to(PACKAGE.parent)}:{line}: {name} in {text}"
            for path in CENTRAL for line, name, text in mentions(path.read_text(), names)]
    assert hits == []


def test_the_scan_sees_a_component_in_a_placement_key_and_a_comment():
    names = _names()
    planted = '# HiFT from MiniCPM-o\nPLACED = {"hift": 1, "decode": 2}\ntext = raw.decode()  # decode bytes\n'
    assert {name for _, name, _ in mentions(planted, names)} == {"hift", "minicpm-o", "decode"}
    assert [line for line, name, _ in mentions(planted, names) if name == "decode"] == [2]


def test_every_target_places_or_declines_every_role():
    for target in TARGETS.values():
        for role in ROLES:
            assert (role in target.placements) != (role in target.facts.get("not_placed", {})), (target.name, role)
        assert set(target.placements) <= {*ROLES, "fp32"}, target.name  # roles only (and the fp32 fallback)


def test_a_recipe_with_a_new_role_plans_once_it_says_what_it_is_placed_like():
    """A toy recipe brings a role no target knows: planning it is a one-line error naming the
    declaration it lacks, on every target; declaring the known role it is placed like plans it
    everywhere that role is placed, with the recipe's own precisions where it declares them."""
    toy = replace(RECIPES.facts("spark-x2.5"), name="toy", components={"speaker_encoder": "speaker", "decode": "llm"})
    for target in TARGETS.values():
        with pytest.raises(EdgexError, match=r"does not place role 'speaker'.*RecipeFacts\.placed_like"):
            plan(toy, target, ["speaker_encoder"], None, None)
    declared = replace(toy, placed_like={"speaker": "decoder"},
                       placed_precisions={"speaker_encoder": ComponentPrecisions({"coreml": ("fp32",)}, "toy reason")})
    for target in TARGETS.values():
        # a decoder placed only where a recipe declares the file (llama.cpp's libmtmd) places none of the toy's
        if "decoder" in target.facts.get("not_placed", {}) or any(p.declared_only for p in target.placements["decoder"]):
            with pytest.raises(EdgexError, match="places none of toy's components"):
                plan(declared, target, ["speaker_encoder"], None, None)
            continue
        jobs = plan(declared, target, ["speaker_encoder"], None, None)
        assert jobs and {j.role for j in jobs} == {"speaker"}, target.name
        decoder = {(p.exporter, q) for p in target.placements["decoder"] for q in p.precisions}
        if target.name == "apple":
            assert {(j.exporter, j.precision) for j in jobs} == {("coreml", "fp32")}
            assert dict(jobs[0].placement)["recipe_precisions"] == "toy reason"
        else:
            assert {(j.exporter, j.precision) for j in jobs} == decoder
