"""The build file (TOML) and the jobs it expands to: one job = one artifact of one export.

```toml
[build]                          # defaults for every entry (all optional)
seed = 0
threads = 1                      # runtime threads for parity runs

[[entry]]
model = "MODEL"                  # a registered model (`edgex list`)
preset = "tiny"                  # or checkpoint = "path" (relative to the build file)
targets = ["cpu", "s25-htp"]
components = ["COMPONENT"]       # optional filters, as `edgex export -c/-f/-p`
formats = ["onnx", "qnn"]
precisions = ["fp16"]
min_db = { "*" = 30, decoder = 40 }   # gate overrides: "*", ROLE, PRECISION or ROLE:PRECISION
placements = ["decoder=qnn:fp16"]
set = { context = 256 }          # recipe build options
calibration = 8
name = "MODEL-tiny"              # output folder instead of the model name
```

Every name is checked here, through the same planner `edgex export` uses, before anything is built.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import EdgexError
from ..parity.gates import check_overrides, threshold_db
from ..plan import Job, placement_overrides, plan
from ..recipes import RECIPES
from ..status import check_unverified_kinds, unverified_kinds
from ..targets import get_target

_ENTRY_KEYS = {"model", "preset", "checkpoint", "seed", "targets", "components", "formats", "precisions", "min_db",
               "placements", "set", "calibration", "name", "threads"}
_BUILD_KEYS = {"seed", "threads", "allow_unverified"}


@dataclass(frozen=True)
class BuildJob:
    """One artifact: what `export_model` is asked for, restricted to one component/format/precision."""

    entry: int  # index of the [[entry]] it came from
    name: str  # output folder: <out>/<name>/<target>/
    model: str
    preset: str | None
    checkpoint: str | None  # resolved path
    seed: int
    settings: tuple  # (key, text) pairs, recipe build options
    target: str
    placements: tuple  # --placement texts
    min_db: tuple  # (key, dB) gate overrides as written
    calibration: int | None
    threads: int | None
    component: str
    role: str
    exporter: str
    precision: str
    exporter_options: tuple  # what the planner passes to the exporter (SoC, calibration size)
    placement: tuple  # where it runs on the device (planner's placement facts)

    @property
    def id(self) -> str:
        return f"{self.name}/{self.target}/{self.component}.{self.precision}.{self.exporter}"

    @property
    def folder(self) -> str:
        return f"{self.name}/{self.target}"

    @property
    def planned(self) -> Job:
        """The planner's job this artifact is (what its cache key reads, as an export's key does)."""
        return Job(self.component, self.role, self.exporter, self.precision, self.exporter_options, self.placement)

    @property
    def gate_db(self) -> float:
        """The gate this artifact is held to (the overrides that apply to it, else the default)."""
        return threshold_db(self.role, self.precision, dict(self.min_db))

    def to_json(self) -> dict:
        data = asdict(self)
        for key in ("settings", "min_db", "exporter_options", "placement"):
            data[key] = dict(data[key])
        data["placements"] = list(self.placements)
        return data


@dataclass(frozen=True)
class BuildPlan:
    file: Path
    file_sha256: str
    jobs: list[BuildJob]
    # [build] allow_unverified = ["sidecar"]: unverified entries of the kinds named (`edgex.status`)
    # leave the build "pass" instead of "incomplete" (exit 0, not 3) where every job has an entry that
    # ran and passed; each stays verdict "unverified" in the reports, its files under unverified/.
    allow_unverified: tuple[str, ...] = ()

    @property
    def digest(self) -> str:
        """Names the plan: shards of the same plan agree on it, `merge` refuses shards that do not."""
        text = json.dumps([j.to_json() for j in self.jobs], sort_keys=True, allow_nan=False)
        return hashlib.sha256(text.encode()).hexdigest()


def _strings(value, key: str, where: str) -> list[str]:
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, list) or not all(isinstance(v, str) and v for v in values):
        raise EdgexError(f"{where}: {key} must be a name or a list of names")
    return values


def _int(value, key: str, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise EdgexError(f"{where}: {key} must be an integer, got {value!r}")
    return value


def _gates(value, where: str) -> dict[str, float]:
    if value is None:
        return {}
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {"*": float(value)}
    if isinstance(value, dict) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value.values()):
        return {str(k): float(v) for k, v in value.items()}
    raise EdgexError(f"{where}: min_db must be a number or a table of KEY = DB (KEY: *, ROLE, PRECISION or ROLE:PRECISION)")


def read_build_file(path: Path) -> dict:
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise EdgexError(f"cannot read build file {path}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise EdgexError(f"build file {path} is not valid TOML: {exc}") from None
    unknown = set(data) - {"build", "entry"}
    if unknown:
        raise EdgexError(f"build file {path}: unknown section(s) {', '.join(sorted(unknown))} (known: build, entry)")
    if not isinstance(data.get("entry"), list) or not data["entry"]:
        raise EdgexError(f"build file {path} has no [[entry]]")
    return data


def load_plan(path: Path) -> BuildPlan:
    """Every job of the build file, in file order; bad names fail here with the entry they are in."""
    path = Path(path)
    data = read_build_file(path)
    defaults = data.get("build", {})
    unknown = set(defaults) - _BUILD_KEYS
    if unknown:
        raise EdgexError(f"{path} [build]: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_BUILD_KEYS))})")
    jobs: list[BuildJob] = []
    for index, entry in enumerate(data["entry"]):
        where = f"{path} entry {index + 1}"
        unknown = set(entry) - _ENTRY_KEYS
        if unknown:
            raise EdgexError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_ENTRY_KEYS))})")
        try:
            jobs.extend(entry_jobs(index, entry, defaults, path.parent, where))
        except EdgexError as exc:
            raise EdgexError(f"{where}: {exc}") from None
    seen: dict[str, int] = {}
    for job in jobs:
        if job.id in seen:
            raise EdgexError(f"{path}: entries {seen[job.id] + 1} and {job.entry + 1} both build {job.id}; give one a distinct name")
        seen[job.id] = job.entry
    _check_folders(path, jobs)
    allow = defaults.get("allow_unverified", [])
    if not isinstance(allow, list) or not all(isinstance(k, str) for k in allow):
        raise EdgexError(f"{path} [build]: allow_unverified names the kinds accepted unverified, e.g. [\"sidecar\"] "
                         f"(known: {', '.join(unverified_kinds())}), got {allow!r}")
    allow = check_unverified_kinds(allow, f"{path} [build] allow_unverified")
    return BuildPlan(path, hashlib.sha256(path.read_bytes()).hexdigest(), jobs, tuple(allow))


def entry_jobs(index: int, entry: dict, defaults: dict, base: Path, where: str) -> list[BuildJob]:
    if "model" not in entry or "targets" not in entry:
        raise EdgexError("needs model and targets")
    recipe = RECIPES.facts(entry["model"])
    preset, checkpoint = entry.get("preset"), entry.get("checkpoint")
    if preset and checkpoint:
        raise EdgexError("give either preset or checkpoint, not both")
    if checkpoint is not None:
        checkpoint = (base / checkpoint).resolve()
        if not checkpoint.is_dir():
            raise EdgexError(f"checkpoint {checkpoint} is not a folder")
    else:
        preset = preset or recipe.default_preset
        recipe.check_preset(preset)
    settings = {str(k): str(v) for k, v in (entry.get("set") or {}).items()}
    recipe.parse_options(settings)
    calibration = _int(entry.get("calibration"), "calibration", where)
    if calibration is not None and calibration < 1:
        raise EdgexError(f"calibration must be at least 1, got {calibration}")
    seed = _int(entry.get("seed", defaults.get("seed", 0)), "seed", where)
    threads = _int(entry.get("threads", defaults.get("threads")), "threads", where)
    min_db = _gates(entry.get("min_db"), where)
    check_overrides(min_db, set(recipe.components.values()))  # here, not at export: a cached job never exports
    placements = _strings(entry.get("placements", []), "placements", where)
    components = _strings(entry["components"], "components", where) if "components" in entry else None
    formats = _strings(entry["formats"], "formats", where) if "formats" in entry else None
    precisions = _strings(entry["precisions"], "precisions", where) if "precisions" in entry else None
    name = entry.get("name", recipe.name)
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise EdgexError(f"name must be a plain folder name, got {name!r}")
    jobs = []
    for target in _strings(entry["targets"], "targets", where):
        tgt = get_target(target)
        if placements:
            tgt = tgt.with_overrides(placement_overrides(recipe, placements), recipe.placement_roles)
        for job in plan(recipe, tgt, components, formats, precisions, calibration, preset, checkpoint):
            jobs.append(BuildJob(
                index, name, recipe.name, preset, str(checkpoint) if checkpoint else None, seed,
                tuple(sorted(settings.items())), target, tuple(placements), tuple(sorted(min_db.items())), calibration,
                threads, job.component, job.role, job.exporter, job.precision, job.options, job.placement,
            ))
    return jobs


def _check_folders(path: Path, jobs: list[BuildJob]) -> None:
    """One folder holds one manifest, so one model source: entries that differ in weights or build
    options cannot share a folder (`edgex verify` rebuilds the model from the folder's manifest)."""
    sources: dict[str, tuple] = {}
    for job in jobs:
        source = (job.model, job.preset, job.checkpoint, job.seed, job.settings)
        if sources.setdefault(job.folder, source) != source:
            raise EdgexError(f"{path}: entry {job.entry + 1} writes {job.folder} with another model source or --set "
                             "options than an earlier entry; give it a distinct name")
