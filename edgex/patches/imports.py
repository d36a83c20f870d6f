"""The import system: placeholders for what packages installed without their dependencies import
and never use.

A placeholder is in `sys.modules`, or answered by a finder at the front of `sys.meta_path`, only
while the package's own modules are imported (`placed`, `placeholders_under`), and is removed after:
the modules imported keep what they took from it, and an application that imports edgex finds its
own `datasets`, `librosa`, `stepaudio2` or `lerobot.policies` afterwards, and its importers as they
were. Only edgex's own aliases (names under `_edgex_`, which shadow nothing) stay (`own_packages`).

Which modules each model's import needs is said where it is imported (the recipes'
`*_import.py` modules); the names are registered here.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from contextlib import contextmanager
from pathlib import Path

from ..errors import EdgexError
from .registry import REQUIRED, register

OWN_PREFIX = "_edgex_"  # edgex's own package aliases: shadow nothing, so they may stay


class Placeholder(types.ModuleType):
    """A module whose every attribute is a class that raises when instantiated or called, saying `why`."""

    __path__: list = []

    def __init__(self, name: str, why: str):
        super().__init__(name)
        self._edgex_why = why

    def __getattr__(self, name: str):
        if name.startswith("__") or name == "_edgex_why":
            raise AttributeError(name)
        what = f"{self.__name__}.{name}"
        why = self._edgex_why

        def fail(*_args, **_kwargs):
            raise EdgexError(f"{what}: {why}")

        return type(name, (), {"__init__": fail, "__module__": self.__name__})


def package(name: str, path: Path | str) -> types.ModuleType:
    """An empty package module `name` whose submodules are the files under `path` (its own
    `__init__` is not run)."""
    module = types.ModuleType(name)
    module.__path__ = [str(path)]
    return module


@contextmanager
def placed(modules: dict[str, types.ModuleType]):
    """Each of `modules` not already imported is `sys.modules[name]` for the duration; after, those
    placed are removed again (the modules imported meanwhile stay)."""
    placed_here = {name: module for name, module in modules.items() if name not in sys.modules}
    sys.modules.update(placed_here)
    try:
        yield
    finally:
        for name, module in placed_here.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers every module under `prefixes` with a `Placeholder`, and remembers what it made."""

    def __init__(self, prefixes: tuple[str, ...], why: str):
        self.prefixes, self.why, self.made = prefixes, why, []

    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == p or fullname.startswith(p + ".") for p in self.prefixes):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = Placeholder(spec.name, self.why)
        self.made.append(module)
        return module

    def exec_module(self, module):
        pass


@contextmanager
def placeholders_under(prefixes: tuple[str, ...], why: str):
    """Every module under `prefixes` not yet imported imports as a `Placeholder` for the duration (a finder at the front of `sys.meta_path`); after, the finder and every placeholder it
    made are gone."""
    finder = _PlaceholderFinder(prefixes, why)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for module in finder.made:
            if sys.modules.get(module.__name__) is module:
                del sys.modules[module.__name__]


def own_packages(modules: dict[str, types.ModuleType]) -> None:
    """edgex's own package aliases (names under `OWN_PREFIX`) in `sys.modules` for good: they
    shadow nothing, and the modules loaded under them import each other through them."""
    for name, module in modules.items():
        if not name.startswith(OWN_PREFIX):
            raise ValueError(f"{name}: only names under {OWN_PREFIX} stay in sys.modules")
        sys.modules[name] = module


LEROBOT_PLACEHOLDERS = ("lerobot.datasets", "datasets", "lerobot.robots", "lerobot.teleoperators")


@register("imports.lerobot_policies", kind=REQUIRED, checked={"lerobot": "0.4.4"},
          symbols=("sys.meta_path", *LEROBOT_PLACEHOLDERS, "lerobot.policies"),
          saves="LeRobot 0.4.4's ACT, Diffusion and SmolVLA modules import without its dataset, robot and "
                "teleoperator dependencies, and without `lerobot.policies.__init__` (which imports GR00T, whose "
                "diffusers code does not import against this torchao)",
          no_op="a `lerobot.policies` already imported is used as it is")
def lerobot_policies(policies: Path | str):
    """While LeRobot's policy modules are imported: placeholders for `LEROBOT_PLACEHOLDERS`, and
    `lerobot.policies` as a package of the files under `policies` without its `__init__`."""
    with placeholders_under(LEROBOT_PLACEHOLDERS, "a placeholder in edgex's LeRobot import (not used for inference)"), \
            placed({"lerobot.policies": package("lerobot.policies", policies)}):
        yield


@register("imports.qwen_tts_models", kind=REQUIRED, checked={"qwen-tts": "0.1.1"},
          symbols=("librosa", "librosa.filters", "_edgex_qwen_tts.inference.qwen3_tts_tokenizer"),
          saves="qwen-tts's model files import without its package `__init__` (gradio, librosa, soundfile)",
          no_op="an installed librosa is used as it is")
def qwen_tts_models(modules: dict[str, types.ModuleType]):
    """`modules` (edgex's mel-filter stand-in for an absent librosa, the tokenizer front end's
    placeholder) in place while qwen-tts's model files are imported."""
    with placed(modules):
        yield


@register("imports.stepaudio2_vocoder", kind=REQUIRED, checked={"minicpmo-utils": "1.0.5"},
          symbols=("stepaudio2", "stepaudio2.cosyvoice2", "stepaudio2.flashcosyvoice", "torchaudio", "s3tokenizer",
                   "hyperpyyaml"),
          saves="Step-Audio2's Token2wav vocoder files import without the package `__init__` (torchaudio, "
                "s3tokenizer, hyperpyyaml, the speaker model)",
          no_op="a `stepaudio2` (or front-end module) already imported is used as it is")
def stepaudio2_vocoder(modules: dict[str, types.ModuleType]):
    """`modules` (empty packages over the vocoder's folders, placeholders for its front end) in
    place while the vocoder's files are imported."""
    with placed(modules):
        yield


TORCHVISION_FAKE_KERNELS = "torchvision._meta_registrations"


class _SkipFakeKernelsWithoutOps(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers `TORCHVISION_FAKE_KERNELS` with an empty module where torchvision's C++ ops did not
    load; takes itself off `sys.meta_path` once asked (torchvision imports it once)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TORCHVISION_FAKE_KERNELS:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        from torchvision import extension  # already imported: torchvision loads it first

        return None if extension._has_ops() else importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        pass


@register("imports.torchvision_without_ops", kind=REQUIRED, checked={"torchvision": "0.28.0", "torch": "2.13.0"},
          symbols=("sys.meta_path", TORCHVISION_FAKE_KERNELS, "torchvision.extension._has_ops"),
          saves="torchvision (a CUDA build, whose C++ ops do not load beside the CPU torch) imports, and with it "
                "transformers and every model it loads",
          no_op="where torchvision's ops load, or torchvision was imported before edgex")
def torchvision_without_ops() -> None:
    """Installs the finder (once, when edgex is imported) and leaves it: it answers torchvision's one
    import of its fake kernels, whenever that comes (transformers imports torchvision lazily), then
    takes itself off `sys.meta_path`."""
    if TORCHVISION_FAKE_KERNELS not in sys.modules and not any(isinstance(f, _SkipFakeKernelsWithoutOps) for f in sys.meta_path):
        sys.meta_path.insert(0, _SkipFakeKernelsWithoutOps())
