"""What an artifact is a function of, as JSON-able key inputs and their sha256.

One definition for the two places that reuse work: the build cache keys one artifact by it
(`edgex.build.cache`), and `edgex export` keys a whole export call by its jobs in order
(`edgex.artifacts.reuse`), so the two cannot disagree on what invalidates an artifact:

- `environment()`: the bytes of every file of the installed edgex package (recipes, exporters,
  runtimes, gates, targets, this module): any code change re-exports; the Python version, the
  machine architecture and the CPU features the runtimes choose their kernels by (`edgex.host`,
  as `edgex doctor` prints them);
- `source_inputs()`: the model, the target, the weights (a preset name, whose weights edgex source
  already hashed generates from the seed, or the sha256 of every file in the checkpoint folder, by
  relative path, plus the files outside it the recipe builds the model from, `external_inputs`:
  SmolVLA's VLM config), the seed (it also drives the eager pipeline that makes the parity samples,
  so it is in the key either way), the recipe build options as text (`--set`), and the versions of
  the packages the eager model and its reference run (`BASE_PACKAGES` and the recipe's
  `reference_packages`: lerobot, diffusers, torchvision, transformers, qwen-tts, minicpmo-utils ...);
- `job_inputs()`: per artifact, the component, role, exporter, precision, exporter options (SoC,
  calibration size), placement, the gates it is held to (the effective dB of its parity gate and of
  its lowering gate, so an override that does not apply to it does not invalidate it), parity
  threads, the versions of the toolchain that lowers and runs it (the exporter's `requires` and
  its runtime's: executorch, onnxruntime-qnn, gguf and llama-cpp-python ...), and what its
  runtime's build chose for this host (`Runtime.build_variant`: llama.cpp's CPU backend).

So a new version of a package re-exports exactly the artifacts it shapes: lerobot the LeRobot
recipes' artifacts, coremltools the Core ML artifacts, torch and numpy every artifact.

A verdict is a function of the host kind as well as of the files: XNNPACK's fp16 kernels sum in
fp16 on AVX512-FP16, ONNX Runtime and llama.cpp pick kernels by SIMD features, and llama.cpp is
built for the CPU it was set up on. So a cache restored on another kind of runner (a CI cache
shared across runner types) misses, and the artifact is exported and its parity run again there:
no verdict measured on one host kind is served on another.

Nothing else edgex passes to `export_model` changes an artifact: edgex reads the environment only to
quiet library logs and the clock only for the manifest's `created`, and the targets' tables live in
the hashed source. Outside the key, and said so: the CPU model beyond its features, and the thread
count torch runs the eager model with (`OMP_NUM_THREADS`, the worker count of `--jobs`). Reductions
in another order can move eager activations in the last bits, hence calibration ranges of quantized
schemes and parity figures in their last digits. A reused artifact keeps the figures measured when
it was made, on the host its manifest records.
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EdgexError
from ..parity.gates import lowering_db, threshold_db
from .. import host, toolchain
from .files import sha256

if TYPE_CHECKING:
    from ..plan import Job

# 2: the lowering gate joined the job's inputs; 3: package versions per recipe and exporter; 4: the
# host's CPU features and the runtime's build variant
KEY_VERSION = 4

# What every eager model and every exporter runs on, whatever the recipe.
BASE_PACKAGES = ("torch", "numpy")


def tree_sha256(root: Path, skip=lambda p: False) -> str:
    """sha256 over (relative path, file sha256) of every file under `root`, in path order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file() and not skip(p)):
        digest.update(f"{path.relative_to(root).as_posix()}\0{sha256(path)}\n".encode())
    return digest.hexdigest()


def edgex_source_sha256() -> str:
    package = Path(__file__).resolve().parent.parent
    return tree_sha256(package, skip=lambda p: "__pycache__" in p.parts or p.suffix == ".pyc")


def environment() -> dict:
    return {"key_version": KEY_VERSION, "edgex_source": edgex_source_sha256(),
            "python": platform.python_version(), "machine": platform.machine(), "cpu_features": host.cpu_features()}


def package_versions(dists) -> dict[str, str | None]:
    """Installed version of each distribution (None: not installed), by name."""
    return {dist: toolchain.version(dist) for dist in sorted(set(dists))}


def reference_packages(model: str) -> dict[str, str | None]:
    """The versions of what `model`'s eager model and reference run: `BASE_PACKAGES` and the recipe's own."""
    from ..recipes import RECIPES

    return package_versions((*BASE_PACKAGES, *RECIPES.facts(model).reference_packages))


def toolchain_packages(exporter: str) -> dict[str, str | None]:
    """The versions of what lowers and runs an exporter's artifacts: its `requires` and its runtime's."""
    from ..exporters import EXPORTERS
    from ..parity.runtimes import RUNTIMES

    lowering = EXPORTERS.facts(exporter)
    modules = (*lowering.requires, *RUNTIMES.facts(lowering.runtime).requires)
    return package_versions(toolchain.TOOLCHAINS.get(module, (module,))[0] for module in modules)


def weights_inputs(model: str, preset: str | None, checkpoint: Path | None) -> dict:
    """The weights' part of the key: the preset name, or the checkpoint folder's content hash plus the
    files outside it the recipe builds the model from (`RecipeFacts.external_inputs`)."""
    if checkpoint is None:
        return {"preset": preset}
    from ..recipes import RECIPES

    try:
        digest = tree_sha256(checkpoint)
    except OSError as exc:
        raise EdgexError(f"cannot read checkpoint {checkpoint}: {exc.strerror or exc}") from None
    external = RECIPES.facts(model).external_inputs
    return {"checkpoint_sha256": digest, **({"external": external(Path(checkpoint))} if external else {})}


def source_inputs(model: str, target: str, weights: dict, seed: int, settings: dict[str, str]) -> dict:
    """The weights (`weights_inputs`), what the eager model is built with and the packages it runs."""
    return {"model": model, **weights, "seed": seed, "settings": dict(settings), "target": target,
            "reference_packages": reference_packages(model)}


def runtime_build(exporter: str) -> dict:
    """What the runtime that gates an exporter's artifacts chose for this host, where it says
    (`Runtime.build_variant`); empty elsewhere."""
    from ..exporters import EXPORTERS
    from ..parity.runtimes import RUNTIMES

    variant = RUNTIMES.facts(EXPORTERS.facts(exporter).runtime).build_variant()
    return {"runtime_build": variant} if variant else {}


def job_inputs(job: Job, overrides: dict[str, float], threads: int | None) -> dict:
    return {"component": job.component, "role": job.role, "exporter": job.exporter, "precision": job.precision,
            "exporter_options": dict(job.options), "placement": dict(job.placement),
            "gate_db": threshold_db(job.role, job.precision, overrides),
            "lowering_db": _lowering_gate(job.precision, overrides), "threads": threads,
            "toolchain_packages": toolchain_packages(job.exporter), **runtime_build(job.exporter)}


def _lowering_gate(precision: str, overrides: dict[str, float]) -> float | None:
    """The lowering gate of a quantized or fp16 artifact (`--min-db lowering=...` moves it, and with
    it the verdict); None for a precision that has none (fp32: no scheme reference to lower against)."""
    try:
        return lowering_db(precision, overrides)
    except EdgexError:
        return None


def digest(inputs: dict) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, allow_nan=False).encode()).hexdigest()
