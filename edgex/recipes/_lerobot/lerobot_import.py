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
  of torchvision, transformers' included: ``edgex/patches/imports.py`` says why). The policies use
  only torchvision's Python models (ResNet), ``FrozenBatchNorm2d`` and transforms.

The list is repeated in docs/models.md ("VLA policies"); the placeholders are registered in
``edgex/patches/imports.py``, and are in place only while the modules are imported. Loading happens
once per process.
"""

from __future__ import annotations

import importlib
import importlib.util
import types
from contextlib import contextmanager
from functools import cache

from ...errors import EdgexError
from ...patches.imports import lerobot_policies


def _torchvision() -> None:
    """torchvision must be installed; `edgex.patches.imports` lets it import without its C++ ops."""
    if importlib.util.find_spec("torchvision") is None:
        raise EdgexError("torchvision is not installed: pip install --no-deps torchvision==0.28.0 (see scripts/setup)")


def _policies() -> str:
    """The folder of LeRobot's policy packages; a one-line error where LeRobot or torchvision is missing."""
    spec = importlib.util.find_spec("lerobot")
    if spec is None or not spec.submodule_search_locations:
        raise EdgexError("lerobot is not installed: pip install --no-deps lerobot==0.4.4 (see scripts/setup)")
    _torchvision()
    return f"{list(spec.submodule_search_locations)[0]}/policies"


@contextmanager
def _importing():
    """LeRobot's placeholders in place while its modules import; an ImportError is edgex's one line."""
    try:
        with lerobot_policies(_policies()):
            yield
    except ImportError as exc:
        raise EdgexError(f"LeRobot's policy code did not import ({exc}); run scripts/setup") from None


def lerobot_module(name: str) -> types.ModuleType:
    """One more of LeRobot's modules (pi0's, imported when a recipe needs it), with the placeholders in
    place as `lerobot_modules` imports its own: after them, `lerobot.policies` is no package of its own
    and its real `__init__` (GR00T, diffusers) would run."""
    lerobot_modules()
    with _importing():
        return importlib.import_module(name)


@cache
def lerobot_modules() -> types.SimpleNamespace:
    """LeRobot's ACT, Diffusion and SmolVLA configuration, modeling and processor modules, imported
    with the placeholders above in place (`patches.imports.lerobot_policies`), which are gone after."""
    load = importlib.import_module
    with _importing():
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
