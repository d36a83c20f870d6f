"""Import LeRobot 0.4.4's policy modules (ACT, Diffusion, SmolVLA) without its dependencies.

``lerobot==0.4.4`` is the newest LeRobot that installs on Python 3.11, and it pins torch < 2.11, so
it is installed with ``--no-deps`` (scripts/setup) next to a few light packages its policy code
really runs (draccus, diffusers' schedulers, einops, accelerate, imageio). What the policy modules
import and never use gets a placeholder that fails loudly if touched:

- ``lerobot.datasets`` and Hugging Face ``datasets``: dataset loading and its progress bars;
- ``lerobot.robots`` and ``lerobot.teleoperators``: robot and teleoperator I/O (pyserial, motors);
- ``lerobot.policies``' own ``__init__`` is skipped: it imports every policy, GR00T among them, whose
  diffusers model code does not import against this torchao;
- ``torchvision._meta_registrations``, only when torchvision's C++ ops did not load (for every import
  of torchvision, transformers' included: ``edgex/torchvision_ops.py`` says why). The policies use
  only torchvision's Python models (ResNet), ``FrozenBatchNorm2d`` and transforms.

The list is repeated in docs/models.md ("VLA policies"). Loading happens once per process.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from functools import cache

from ...errors import EdgexError

PLACEHOLDERS = ("lerobot.datasets", "datasets", "lerobot.robots", "lerobot.teleoperators")


class _Placeholder(types.ModuleType):
    """A module whose every attribute is a class that raises when instantiated or called."""

    __path__: list = []

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def fail(*_args, **_kwargs):
            raise EdgexError(f"{self.__name__}.{name} is a placeholder in edgex's LeRobot import (not used for inference)")

        return type(name, (), {"__init__": fail, "__module__": self.__name__})


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if any(fullname == p or fullname.startswith(p + ".") for p in PLACEHOLDERS):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Placeholder(spec.name)

    def exec_module(self, module):
        pass


def _torchvision() -> None:
    """torchvision must be installed; `edgex.torchvision_ops` lets it import without its C++ ops."""
    if importlib.util.find_spec("torchvision") is None:
        raise EdgexError("torchvision is not installed: pip install --no-deps torchvision==0.28.0 (see scripts/setup)")


@cache
def lerobot_modules() -> types.SimpleNamespace:
    """LeRobot's ACT, Diffusion and SmolVLA configuration, modeling and processor modules."""
    spec = importlib.util.find_spec("lerobot")
    if spec is None or not spec.submodule_search_locations:
        raise EdgexError("lerobot is not installed: pip install --no-deps lerobot==0.4.4 (see scripts/setup)")
    _torchvision()
    sys.meta_path.insert(0, _PlaceholderFinder())
    root = list(spec.submodule_search_locations)[0]
    if "lerobot.policies" not in sys.modules:
        policies = types.ModuleType("lerobot.policies")
        policies.__path__ = [f"{root}/policies"]
        sys.modules["lerobot.policies"] = policies
    load = importlib.import_module
    try:
        return types.SimpleNamespace(
            act=load("lerobot.policies.act.modeling_act"),
            act_config=load("lerobot.policies.act.configuration_act"),
            act_processor=load("lerobot.policies.act.processor_act"),
            diffusion=load("lerobot.policies.diffusion.modeling_diffusion"),
            diffusion_config=load("lerobot.policies.diffusion.configuration_diffusion"),
            diffusion_processor=load("lerobot.policies.diffusion.processor_diffusion"),
            smolvla=load("lerobot.policies.smolvla.modeling_smolvla"),
            smolvla_config=load("lerobot.policies.smolvla.configuration_smolvla"),
            smolvla_vlm=load("lerobot.policies.smolvla.smolvlm_with_expert"),
            types=load("lerobot.configs.types"),
            normalize=load("lerobot.processor.normalize_processor"),
        )
    except ImportError as exc:
        raise EdgexError(f"LeRobot's policy code did not import ({exc}); run scripts/setup") from None
