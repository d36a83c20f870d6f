"""The patches of other libraries' internals (`edgex.patches`): the speed-ups leave the files byte for
byte the same and switch off, each was checked against the installed versions, nothing outside
`edgex/patches` patches another library, and what a patch sets process-wide is undone after."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgex import patches

PACKAGE = Path(__file__).resolve().parents[1] / "edgex"
PATCH_FOLDER = PACKAGE / "patches"


def predictor_step():
    """The tiny qwen3-tts code predictor step: one decode step of a transformer with its KV cache,
    the quickest of the recipe's graphs to lower (`.pte` and `.onnx` in seconds each). Built anew
    each time, under the switch as it is then (a speed-up applies to the model's construction)."""
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    (component,) = recipe.components(recipe.load("tiny", None, 0), ["code_predictor_step"])
    return component


def _export(component, folder: Path) -> dict[str, bytes]:
    from edgex.exporters import EXPORTERS

    folder.mkdir()
    files = {}
    for exporter in ("executorch", "onnx"):
        result = EXPORTERS.get(exporter).export(component, "fp32", folder / f"{component.name}{EXPORTERS.get(exporter).extension}")
        files |= {p.name: p.read_bytes() for p in result.files}
    return files


def test_every_speed_up_leaves_the_exported_files_byte_for_byte_the_same(tmp_path, monkeypatch):
    """The predictor step's `.pte` (ExecuTorch / XNNPACK) and `.onnx` with its data file, built and
    exported with every speed-up on and with `EDGEX_THIRD_PARTY_PATCHES=off`: the same bytes, every
    speed-up applied in the first and none in the second (the libraries' own methods in place
    throughout)."""
    # transformers' import without scikit-learn applies once per process, when qwen-tts's model files
    # are first imported (its own test below runs it in a process of its own)
    speed_ups = {name for name, p in patches.all_patches().items() if p.kind == patches.SPEED_UP} - {"transformers.generation_without_sklearn"}
    files, applied = {}, {}
    for switch in ("on", "off"):
        monkeypatch.setenv(patches.SWITCH, switch)
        patches.APPLIED.clear()
        files[switch] = _export(predictor_step(), tmp_path / switch)
        applied[switch] = set(patches.APPLIED) & speed_ups  # the model import's placeholders apply either way
    assert applied["on"] == speed_ups and applied["off"] == set()
    assert sorted(files["on"]) == ["code_predictor_step.onnx", "code_predictor_step.onnx.data", "code_predictor_step.pte"]
    assert sorted(files["on"]) == sorted(files["off"])
    differ = [name for name in files["on"] if files["on"][name] != files["off"][name]]
    assert differ == []


def test_a_skipped_decomposition_orders_the_inputs_as_the_decomposition_would():
    """ExecuTorch's constant propagation puts the constants it folds after every buffer; a
    decomposition's re-trace moves a root module's constants ahead of its submodules' buffers. A
    decomposition `decompose_only_what_is_left` skips gives the same order (an fp16 `.pte` keeps
    such constants outside its delegates, in that order: the talker decode's differed on and off)."""
    import torch
    from executorch.exir.passes.constant_prop_pass import constant_prop_pass

    from edgex.patches.executorch import decompose_only_what_is_left

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(4))
            self.register_buffer("bias", torch.full((4,), 0.5))

        def forward(self, x):
            return x * self.weight + self.bias

    class Tabled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.arange(4.0))
            self.inner = Scaled()

        def forward(self, x):
            return self.inner(x) + self.table * 2  # read only from a buffer: folded into a constant of the root

    def folded():
        with torch.no_grad(), decompose_only_what_is_left():
            return constant_prop_pass(torch.export.export(Tabled(), (torch.randn(4),)).run_decompositions({}))

    def inputs(program):
        return [(spec.kind.name, spec.target) for spec in program.graph_signature.input_specs]

    retraced = inputs(folded().run_decompositions({}))  # outside the context: torch's own
    program = folded()
    before = inputs(program)
    with decompose_only_what_is_left():
        skipped = program.run_decompositions({})
    assert skipped is program and before != retraced  # skipped, and there was an order to fix
    assert inputs(skipped) == retraced
    assert [n.name for n in skipped.graph.nodes if n.op == "placeholder"] == [s.arg.name for s in skipped.graph_signature.input_specs]


def test_the_installed_libraries_are_the_versions_the_patches_were_checked_against():
    """An upgrade re-verifies a patch (the byte-identity tests, its docstring against the new source)
    and updates `checked`, instead of trusting it."""
    assert patches.version_drift() == []


def test_a_version_other_than_the_checked_one_names_the_patch(monkeypatch):
    monkeypatch.setattr(patches, "installed", lambda dist: "9.9.9" if dist == "executorch" else patches.version(dist).split("+")[0])
    drift = patches.version_drift()
    assert "patch 'executorch.retrace_changed_graphs_only' was checked against executorch 1.5.1, 9.9.9 is installed" in drift
    assert all("executorch" in line for line in drift)


def test_every_patch_says_what_it_saves_and_when_it_changes_nothing():
    for patch in patches.all_patches().values():
        assert patch.symbols and patch.checked and patch.saves and patch.no_op, patch.name
        assert patch.name.split(".")[0] == _module_of(patch), patch.name  # registered in its library's module


def _module_of(patch) -> str:
    for path in sorted(PATCH_FOLDER.glob("*.py")):
        if f'"{patch.name}"' in path.read_text():
            return path.stem
    return ""


# What patching another library looks like in source: the import system edited, an attribute
# assigned (or deleted, or `setattr`) on a name imported from another package, or a name a
# registered patch replaces or reads.
_IMPORT_SYSTEM_WRITES = {"insert", "append", "remove", "pop", "update", "setdefault", "clear", "extend", "__setitem__"}


def _imported_names(tree: ast.AST) -> set[str]:
    """Names bound anywhere in the module by importing another library (not edgex, not relative,
    not Python's own: `tempfile.tempdir` and `os.environ` are set through their public names)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if _other_library(a.name)}
        elif isinstance(node, ast.ImportFrom) and not node.level and _other_library(node.module or ""):
            names |= {a.asname or a.name for a in node.names}
    return names


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_sys(node: ast.AST, attribute: str) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == attribute and isinstance(node.value, ast.Name) and node.value.id == "sys"


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _symbol_names() -> set[str]:
    """Of each private name a patch replaces or reads, its last two dotted parts
    (`ray_constants.ENABLE_RAY_CLUSTER`) and its private parts (`_ExportPassBase`, `_is_cia_op`):
    what naming it in source looks like. Public ones (`torch.multinomial`) may be called anywhere;
    assigning them is what the scan looks for. (The import-system patches are seen by what they do
    to `sys.modules` and `sys.meta_path`.)"""
    found = set()
    for patch in patches.all_patches().values():
        if patch.name.startswith("imports."):
            continue
        for symbol in patch.symbols:
            parts = symbol.split(".")
            if any(_private(p) for p in parts):
                found.add(".".join(parts[-2:]))
                found |= {p for p in parts[-2:] if _private(p)}
    return found


def _other_library(module: str) -> bool:
    return not module.startswith("edgex") and module.split(".")[0] not in sys.stdlib_module_names


def _private_reads(tree: ast.AST, imported: set[str], symbols: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each import of another library's private module or name (`import x._y`,
    `from x._y import z`, `from x import _y`), each private attribute read off a name imported from
    one (`rewriter._DEFAULT_REWRITE_RULES`) and each read, off any object, of a private attribute a
    patch reads (`model._mil_program`). A string that spells a private module, such as a logger's
    name, is none of these: it reads nothing."""
    found = [(node.lineno, f"reads {ast.unparse(node)}") for node in ast.walk(tree)
             if isinstance(node, ast.Attribute) and node.attr in symbols and _root(node) not in imported]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"imports {a.name}") for a in node.names
                      if _other_library(a.name) and any(_private(p) for p in a.name.split("."))]
        elif isinstance(node, ast.ImportFrom) and not node.level and _other_library(node.module or ""):
            private_module = any(_private(p) for p in node.module.split("."))
            found += [(node.lineno, f"imports {node.module}.{a.name}") for a in node.names if private_module or _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr) and _root(node) in imported:
            found.append((node.lineno, f"reads {ast.unparse(node)}"))
    return found


def patching(source: str, symbols: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each place `source` patches another library or reads its private names."""
    tree = ast.parse(source)
    imported = _imported_names(tree)
    found = _private_reads(tree, imported, symbols)
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, (ast.Assign, ast.Delete)):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr") and node.args:
            targets = [ast.Attribute(value=node.args[0], attr="?")]
        for target in targets:
            for t in (target.elts if isinstance(target, ast.Tuple) else [target]):
                if isinstance(t, (ast.Attribute, ast.Subscript)) and (_root(t) in imported or _is_sys(t.value, "modules")
                                                                      or _is_sys(t.value, "meta_path")):
                    found.append((node.lineno, f"assigns {ast.unparse(t)}"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _IMPORT_SYSTEM_WRITES \
                and (_is_sys(node.func.value, "modules") or _is_sys(node.func.value, "meta_path")):
            found.append((node.lineno, f"calls {ast.unparse(node.func)}"))
    for line, text in enumerate(source.splitlines(), 1):
        found += [(line, f"names {s}") for s in sorted(symbols) if re.search(rf"(?<![\w.]){re.escape(s)}(?!\w)", text)
                  or ("." in s and re.search(rf"\b{re.escape(s)}(?!\w)", text))]
    return sorted(found)


def test_nothing_outside_edgex_patches_patches_another_library():
    symbols = _symbol_names()
    assert {"_ExportPassBase", "_is_cia_op", "ray_constants.ENABLE_RAY_CLUSTER", "ONNXRegistry.from_torchlib"} <= symbols
    hits = [f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
            for path in sorted(PACKAGE.rglob("*.py")) if PATCH_FOLDER not in path.parents
            for line, what in patching(path.read_text(), symbols)]
    assert hits == []


def test_the_scan_sees_each_way_of_patching():
    planted = ("import sys\nimport types\nfrom torch.fx import traceback as fx_traceback\n"
               "from executorch.exir import pass_base\n"
               "fx_traceback.copy = types.SimpleNamespace()\n"
               "setattr(pass_base, 'x', 1)\n"
               "sys.meta_path.insert(0, object())\n"
               "sys.modules['datasets'] = types.ModuleType('d')\n"
               "retrace = pass_base._ExportPassBase.call\n"
               "from torch._export.utils import _is_cia_op\n"
               "module.weight = None\nsys.modules.get('x')\nself._is_cia_op_cache = 1\n")
    hits = patching(planted, _symbol_names())
    assert sorted({line for line, _ in hits}) == [5, 6, 7, 8, 9, 10], hits



def test_the_scan_sees_each_private_read_and_not_a_logger_name():
    planted = ("import logging\nimport torch.utils._pytree\n"
               "from torch.utils._python_dispatch import TorchDispatchMode\n"
               "from coremltools.models.utils import _apply_graph_pass\n"
               "from onnxscript import rewriter\n"
               "rules = rewriter._DEFAULT_REWRITE_RULES\n"
               "from torch import nn\nconv = nn.modules.conv._ConvNd\n"
               "logging.getLogger('torch.utils._pytree')\n"  # a logger's name: a string, it imports nothing
               "from ._own import x\nfrom edgex._own import y\nimport _thread\nself._cache = {}\n"
               "ops = model._mil_program.functions\n")  # a registered read's private name, off any object
    hits = patching(planted, _symbol_names())
    assert sorted({line for line, _ in hits}) == [2, 3, 4, 6, 8, 14], hits


RESTORED = """
import json, os, sys
from ray._private import ray_constants
before = (ray_constants.ENABLE_RAY_CLUSTER, {k: os.environ.get(k) for k in ("RAY_USAGE_STATS_ENABLED", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")})
from edgex.build.executors.ray_cluster import connected
with connected(None) as ray:
    during = ray_constants.ENABLE_RAY_CLUSTER
after = (ray_constants.ENABLE_RAY_CLUSTER, {k: os.environ.get(k) for k in ("RAY_USAGE_STATS_ENABLED", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")})
json.dump({"before": before, "during": during, "after": after}, sys.stdout)
"""


def test_an_embedded_ray_leaves_ray_s_settings_as_they_were():
    """Ray imported first by the application (its constant read from its environment), then an edgex
    build's embedded Ray: loopback-only while it runs, the application's settings back after."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run([sys.executable, "-c", RESTORED], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["during"] is False
    assert report["after"] == report["before"] and report["before"][0] is True


IMPORTERS = """
import importlib, json, sys
import edgex
from edgex.recipes._lerobot.lerobot_import import lerobot_modules
from edgex.recipes.minicpm_o.official_stream import token2wav_class
from edgex.recipes.qwen3_tts.qwen_tts_import import qwen_tts_modules
import torchvision
lerobot_modules(), token2wav_class(), qwen_tts_modules()
shadowed = ["datasets", "lerobot.datasets", "lerobot.robots", "lerobot.policies", "librosa", "stepaudio2",
            "stepaudio2.flashcosyvoice", "torchaudio", "s3tokenizer", "hyperpyyaml"]
json.dump({"finders": [f"{type(f).__module__}.{type(f).__name__}" for f in sys.meta_path if type(f).__module__.startswith("edgex")],
           "left": [name for name in shadowed if name in sys.modules]}, sys.stdout)
"""


def test_import_placeholders_are_gone_once_the_models_are_imported():
    """After LeRobot's policies, Step-Audio2's vocoder and qwen-tts's model files are imported, and
    torchvision: no importer of edgex's is left on `sys.meta_path`, and none of the names the
    placeholders stood for is left in `sys.modules`."""
    proc = subprocess.run([sys.executable, "-c", IMPORTERS], capture_output=True, text=True, timeout=120,
                          cwd=PACKAGE.parent, env={**os.environ, "PYTHONPATH": str(PACKAGE.parent)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["finders"] == [] and report["left"] == []


def test_doctor_lists_the_patches_in_force(monkeypatch):
    from rich.console import Console

    from edgex.catalog import doctor
    from edgex.render import doctor_lines

    data = doctor([])
    console = Console(width=400, record=True)
    for shown in doctor_lines(data):
        console.print(shown)
    assert "executorch.retrace_changed_graphs_only" in console.export_text()
    rows = {row["name"]: row for row in data["patches"]}
    assert set(rows) == set(patches.all_patches())
    assert rows["executorch.retrace_changed_graphs_only"]["state"] == "on"
    assert rows["ray.settings"]["symbols"] == ["ray._private.ray_constants.ENABLE_RAY_CLUSTER"]
    monkeypatch.setenv(patches.SWITCH, "off")
    rows = {row["name"]: row for row in doctor([])["patches"]}
    assert {name for name, row in rows.items() if row["state"] == "off"} == {
        name for name, p in patches.all_patches().items() if p.kind == patches.SPEED_UP}


SKLEARN = """
import json, sys
import edgex
from edgex.recipes.qwen3_tts.qwen_tts_import import qwen_tts_modules
qwen_tts_modules()
from transformers.utils import import_utils
json.dump({"sklearn": "sklearn" in sys.modules, "flag": import_utils._sklearn_available}, sys.stdout)
"""


@pytest.mark.parametrize("switch", ["on", "off"])
def test_qwen_tts_s_model_files_import_without_scikit_learn_and_transformers_flag_is_restored(switch):
    """With the speed-ups on, importing qwen-tts's model files (transformers' generation utilities)
    leaves scikit-learn unimported and transformers' own flag as it found it; off, transformers
    imports scikit-learn as it ships (so the test sees the difference the patch makes)."""
    pytest.importorskip("sklearn")
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent), patches.SWITCH: switch}
    proc = subprocess.run([sys.executable, "-c", SKLEARN], capture_output=True, text=True, timeout=120, cwd=PACKAGE.parent, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report == {"sklearn": switch == "off", "flag": True}
