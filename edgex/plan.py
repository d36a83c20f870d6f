"""The export plan: every name on the command line checked, and every job listed, before any
model is built or any heavy toolchain imported.

Light on import (no torch): `edgex export` with a bad name fails in well under a second, and
`edgex export --dry-run` prints the plan without building anything. `export_model` runs the same
checks through `make_plan`, so library callers get the same errors.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from .checkpoints import resolve_checkpoint
from .errors import EdgexError
from .exporters import EXPORTERS
from .precision import get_precision
from .recipes import RECIPES
from .recipes.base import RecipeFacts
from .targets import Placement, Target, get_target, parse_placement


@dataclass(frozen=True)
class Job:
    component: str
    role: str
    exporter: str
    precision: str
    options: tuple = ()  # (key, value) pairs passed to the exporter as keyword arguments
    placement: tuple = ()  # (key, value) pairs: where it runs on the device, what parity here misses
    # Why the recipe declares this precision too coarse for the component (`RecipeFacts.coarse`),
    # when the user asked for it by name; None otherwise.
    coarse: str | None = None


def _job(name: str, role: str, target, placement, precision: str, calibration_size: int | None,
         coarse: str | None = None) -> Job:
    options = dict(target.exporter_options.get(placement.exporter, {}))
    calibration_size = placement.calibration or calibration_size
    if get_precision(precision).calibration and calibration_size:
        options["calibration_size"] = calibration_size
    return Job(name, role, placement.exporter, precision, tuple(options.items()), tuple(placement.to_json().items()), coarse)


def coarse_warning(recipe: str, job: Job) -> str:
    """The one line printed for a job the user asked for although its recipe declares the
    precision too coarse for the component."""
    return (f"warning: {recipe} {job.component} {job.exporter}:{job.precision} is built on request only: {job.coarse}; "
            "its scheme and end-to-end figures are reported, its lowering alone decides the verdict")


def exporter_name(name: str) -> str:
    """An exporter named by itself (`executorch`) or by the format it writes (`pte`, as the summary
    table and the manifest show it); an unknown name is the registry's one-line error."""
    by_format = {EXPORTERS.get(n).format: n for n in EXPORTERS.names()}
    if name not in EXPORTERS.names() and name in by_format:
        return by_format[name]
    EXPORTERS.get(name)
    return name


def not_declared(recipe: RecipeFacts, target, components: list[str] | None, preset: str | None = None,
                 checkpoint: Path | None = None) -> dict[str, str]:
    """Component -> why a `declared_only` placement of `target` does not build it from these weights
    (`RecipeFacts.declared_reason`): said at plan time and recorded in the manifest."""
    reasons = {}
    for name in components or recipe.default_components():
        for placement in recipe.placements_on(target, name):
            if placement.declared_only:
                why = recipe.declared_reason(target, placement.exporter, name, preset, checkpoint)
                if why:
                    reasons[name] = why
    return reasons


def plan(recipe: RecipeFacts, target, components: list[str] | None, formats: list[str] | None,
         precisions: list[str] | None, calibration_size: int | None = None, preset: str | None = None,
         checkpoint: Path | None = None) -> list[Job]:
    """Every (component, exporter, precision) the target places, filtered by the user's choices.
    A precision the recipe declares too coarse for a component (`RecipeFacts.coarse`) is left out
    of the target's defaults, and built only when asked for by name (`precisions`, or a
    `--placement` of the component or its role), its job carrying the reason.

    Unknown names fail here, before any model is built."""
    for p in precisions or []:
        get_precision(p)
    formats = [exporter_name(f) for f in formats] if formats else formats
    recipe.check_components(components)
    roles = recipe.components
    jobs = []
    undeclared = not_declared(recipe, target, components, preset, checkpoint)
    for name in components or recipe.default_components():
        for placement in recipe.placements_on(target, name):
            if formats and placement.exporter not in formats:
                continue
            if placement.declared_only and name in undeclared:
                continue
            exporter = EXPORTERS.get(placement.exporter)
            requested = bool(precisions) or placement.requested
            for p in precisions or placement.precisions:
                coarse = recipe.coarse_reason(name, p)
                if p in exporter.precisions and (requested or coarse is None):
                    jobs.append(_job(name, roles[name], target, placement, p, calibration_size, coarse))
    placed = sorted({pl.exporter for n in roles for pl in recipe.placements_on(target, n)})
    if formats and not set(formats) & set(placed):
        raise EdgexError(f"target {target.name} places none of {', '.join(formats)} (it places: {', '.join(placed)})")
    for p in precisions or []:
        if not any(j.precision == p for j in jobs):
            offered = sorted({pl.exporter for n in roles for pl in recipe.placements_on(target, n)
                              if not formats or pl.exporter in formats})
            raise EdgexError(f"precision {p!r} is not supported by {', '.join(offered) or 'any format'} on target {target.name}")
    if not jobs:
        reasons = target.facts.get("not_placed", {})
        why = sorted({reasons[r] for r in (recipe.placement_role(n) for n in components or roles) if r in reasons}
                     | set(undeclared.values()))
        if why and not formats:
            raise EdgexError(f"target {target.name} places none of {recipe.name}'s components: {'; '.join(why)}")
        raise EdgexError(f"nothing to export: target {target.name} places none of {', '.join(formats or [])}")
    return jobs


def read_placements(values: list[str] | None) -> list[str]:
    """`--placement` values with each `@FILE` replaced by the file's lines (one KEY=EXPORTER:PRECISION
    a line; blank lines and `#` comments skipped): the form `edgex sweep` writes its recommendation in."""
    texts = []
    for value in values or []:
        if not value.startswith("@"):
            texts.append(value)
            continue
        path = Path(value[1:]).expanduser()
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise EdgexError(f"cannot read placement file {path}: {getattr(exc, 'strerror', None) or exc}") from None
        texts += [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]
    return texts


def placement_overrides(recipe: RecipeFacts, placements: list[str]) -> dict[str, tuple[Placement, ...]]:
    """Placements keyed by role or by component name (a component's wins over its role's). A key
    given more than once is placed in each (`decoder=onnx:fp16,decoder=executorch:fp32`); precisions
    for one exporter under one key join into one placement, so they share its calibration size."""
    overrides: dict[str, list[Placement]] = {}
    roles = sorted(set(recipe.components.values()))
    for text in placements:
        key, placement = parse_placement(text)
        if key not in roles and key not in recipe.components:
            raise EdgexError(f"no role {key!r} in {recipe.name} (roles: {', '.join(roles)}; or a component: "
                             f"{', '.join(recipe.components)})")
        precision = placement.precisions[0]
        get_precision(precision)
        EXPORTERS.get(placement.exporter).check(precision)
        if placement.calibration and not get_precision(precision).calibration:
            raise EdgexError(f"--placement {key}: {precision} is not calibrated, a calibration size means nothing there")
        placed = overrides.setdefault(key, [])
        same = next((i for i, p in enumerate(placed) if p.exporter == placement.exporter), None)
        if same is None:
            placed.append(placement)
            continue
        if precision in placed[same].precisions:
            raise EdgexError(f"--placement {key}={placement.exporter}:{precision} is given twice")
        if placed[same].calibration != placement.calibration:
            raise EdgexError(f"--placement {key}: one calibration size per exporter, got {placed[same].calibration} "
                             f"and {placement.calibration} for {placement.exporter}")
        placed[same] = replace(placed[same], precisions=placed[same].precisions + (precision,))
    return {key: tuple(placed) for key, placed in overrides.items()}


@dataclass
class ExportPlan:
    """What `export_model` will do: the checked inputs and the jobs, nothing built yet."""

    recipe: RecipeFacts
    target: Target
    out_dir: Path  # <out>/<model>/<target>
    jobs: list[Job]
    preset: str | None
    checkpoint: Path | None  # a local folder (hub ids already resolved from the local cache)
    options: dict = field(default_factory=dict)  # the recipe's parsed build options

    def artifact_path(self, job: Job) -> Path:
        """Where the job's primary file lands when it passes (failing ones go under `failed/`)."""
        return self.out_dir / f"{job.component}.{job.precision}{EXPORTERS.get(job.exporter).extension}"

    def to_json(self) -> dict:
        return {
            "model": self.recipe.name,
            "target": self.target.name,
            "source": {"checkpoint": str(self.checkpoint)} if self.checkpoint else {"preset": self.preset or self.recipe.default_preset},
            "out_dir": str(self.out_dir),
            "jobs": [{"component": j.component, "role": j.role, "format": j.exporter, "precision": j.precision,
                      "path": str(self.artifact_path(j)), **({"placement": dict(j.placement)} if j.placement else {}),
                      **({"coarse_scheme": j.coarse} if j.coarse else {})}
                     for j in self.jobs],
        }


def make_plan(
    model: str,
    target: str,
    out: Path,
    *,
    preset: str | None = None,
    checkpoint: Path | str | None = None,
    components: list[str] | None = None,
    formats: list[str] | None = None,
    precisions: list[str] | None = None,
    placements: list[str] | None = None,
    calibration_size: int | None = None,
    settings: dict[str, str] | None = None,
) -> ExportPlan:
    """Check every name and value, then list the jobs. Raises one-line EdgexErrors; writes nothing."""
    recipe = RECIPES.facts(model)
    tgt = get_target(target)
    placements = read_placements(placements)
    if placements:
        tgt = tgt.with_overrides(placement_overrides(recipe, placements), recipe.placement_roles)
    if preset and checkpoint:
        raise EdgexError("give either --preset or --checkpoint, not both")
    recipe.check_preset(preset)
    if calibration_size is not None and calibration_size < 1:
        raise EdgexError(f"--calibration must be at least 1, got {calibration_size}")
    options = recipe.parse_options(settings)
    folder = resolve_checkpoint(checkpoint) if checkpoint is not None else None
    jobs = plan(recipe, tgt, components, formats, precisions, calibration_size, preset, folder)
    for job in jobs:
        EXPORTERS.get(job.exporter).check(job.precision)
    undeclared = not_declared(recipe, tgt, components, preset, folder)
    if undeclared:  # in the manifest's target facts, beside the roles the target does not place
        tgt = replace(tgt, facts={**tgt.facts, "not_built": undeclared})
    return ExportPlan(recipe, tgt, Path(out) / model / target, jobs, preset, folder, options)
