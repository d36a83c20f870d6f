"""`edgex` command line: parses, calls the library, renders with rich. No work happens here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperGroup

from .artifacts.across import ENV as ARTIFACT_CACHE
from .arguments import calibration_sizes, request_spec, split_values, transcript_ids
from .errors import EdgexError
from .logs import native_output_quiet, quiet_libraries, set_verbose, verbose as is_verbose
from .render import (PIPED_WIDTH, build_table, catalog_lines, doctor_lines, failed_lines, pipeline_table, plan_table,
                     summary_table, unverified, verdict_cell, verify_table)
from .status import passed

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Turn models into verified on-device artifacts.")
err = Console(stderr=True, width=None if sys.stderr.isatty() else PIPED_WIDTH)
out = Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)


def _exit(status: str, failed: str, unverified: list[str]) -> None:
    """Exit codes of export and verify: 1 a gate failed, 3 something could not be verified (and
    --allow-unverified was not given); unverified artifacts are named with their reason either way."""
    if unverified:
        colour = "red" if status == "incomplete" else "yellow"
        hint = (": not a pass (--allow-unverified KIND accepts a kind, where each job has a file that ran and passed)"
                if status == "incomplete" else " (their kinds accepted)")
        err.print(f"[{colour}]edgex:[/{colour}] {len(unverified)} artifact(s) unverified{hint}: {escape('; '.join(unverified))}",
                  highlight=False, soft_wrap=True)
    if status == "fail":
        err.print(f"[red]edgex:[/red] {failed}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    if status == "incomplete":
        raise typer.Exit(3)


# One meaning per option, whichever command takes it: these are shared, and --help shows the same text.
_ALLOW_HELP = ("accept unverified entries of these kinds (exit 0, not 3, where every job has a file that ran and passed): "
               "sidecar (a QNN .dlc), or a format, e.g. qnn-dlc, mlpackage; repeat or comma-separate")
_VERBOSE_HELP = "show the toolchains' own logs (native and Python) instead of edgex's lines only"
_THREADS_HELP = ("threads each runtime uses when it runs an artifact here (parity, latency, pipeline stages), and the "
                 "eager model beside it where the command runs one; default: the runtime's own choice")
_MIN_DB_HELP = ("gate override, repeatable: DB (every artifact), ROLE=DB, PRECISION=DB, ROLE:PRECISION=DB, "
                "lowering=DB or lowering:PRECISION=DB (the lowering gate of fp16 / quantized artifacts); most specific wins")
_PLACEMENT_HELP = ("place a role or component: KEY=EXPORTER:PRECISION[:CALIBRATION], e.g. decoder=qnn:fp16, or @FILE "
                   "(one a line, as edgex sweep's recommended.placement); repeatable, each one is added")


def _threads_option():
    return typer.Option(None, "--threads", min=1, help=_THREADS_HELP)


def _verbose_option():
    return typer.Option(False, "--verbose", "-v", help=_VERBOSE_HELP)


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help=_VERBOSE_HELP)):
    """Turn models into verified on-device artifacts."""
    set_verbose(verbose)


def _fail(exc: EdgexError) -> None:
    # escaped: messages quote user input and install hints such as 'edgex[llama]', not markup
    err.print(f"[red]edgex:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


_EXECUTOR_HELP = ("where uncached jobs run: local (here, side by side as edgex export runs them) or ray (on a Ray cluster, "
                  "docs/ray.md)")
_JOBS_HELP = ("with --executor local: jobs side by side, each in a process that shares its eager model (default: one per "
              "core)")
_MAX_MEMORY_HELP = ("with --executor local: GB of memory the build may hold: a job starts beside others only while it fits "
                    "(default: 85 % of what is free)")
_ADDRESS_HELP = ("with --executor ray: an existing Ray cluster (host:port of its head, auto, or ray://HOST:PORT); "
                 "default: an embedded Ray instance on this machine, loopback only")


@app.command()
def export(
    model: str = typer.Argument(..., help="model recipe, e.g. qwen3-tts"),
    target: str = typer.Option("cpu", "--target", "-t", help="device profile"),
    preset: Optional[str] = typer.Option(None, help="seeded random weights of a named config (default: tiny)"),
    checkpoint: Optional[Path] = typer.Option(None, help="Hugging Face-layout checkpoint: a folder, or a hub id (ORG/NAME[@REV]) already in the local HF cache (never downloaded)"),
    seed: int = typer.Option(0, help="seed for preset weights and the eager pipeline"),
    out_dir: Path = typer.Option(Path("out"), "--out", "-o", help="output root: the artifacts and manifest.json go to <out>/<model>/<target>/"),
    component: Optional[List[str]] = typer.Option(None, "--component", "-c", help="only these components"),
    fmt: Optional[List[str]] = typer.Option(None, "--format", "-f", help="only these formats (exporter or format names: executorch or pte, onnx, ...)"),
    precision: Optional[List[str]] = typer.Option(None, "--precision", "-p", help="precisions instead of the target's defaults"),
    min_db: Optional[List[str]] = typer.Option(None, "--min-db", help=_MIN_DB_HELP),
    placement: Optional[List[str]] = typer.Option(None, "--placement", help=_PLACEMENT_HELP + " (a key given twice is built in both)"),
    calibration: Optional[int] = typer.Option(None, "--calibration", help="calibration input sets for quantized schemes (default: the component's own, 8; 16 for the predictor step)"),
    threads: Optional[int] = _threads_option(),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="jobs side by side, each in a process that shares the eager model "
                                       "(default: one per core)"),
    max_memory: Optional[float] = typer.Option(None, "--max-memory", min=0.1, help="GB of memory the export may hold: a job starts "
                                               "beside others only while it fits (default: 85 % of what is free)"),
    executor: str = typer.Option("local", "--executor", help="where the jobs run: local (here) or ray (on a Ray cluster, "
                                 "docs/ray.md; the manifest is written here)"),
    address: Optional[str] = typer.Option(None, "--address", help=_ADDRESS_HELP),
    settings: Optional[List[str]] = typer.Option(None, "--set", help="recipe build option KEY=VALUE, e.g. max_context=1024 (see edgex list)"),
    as_json: bool = typer.Option(False, "--json", help="print the manifest as JSON"),
    hub: bool = typer.Option(False, "--hub", help="also run each artifact on a Qualcomm AI Hub device (token: qai-hub configure)"),
    hub_device: Optional[str] = typer.Option(None, "--hub-device", help="AI Hub device name instead of the target's (implies --hub)"),
    hub_timeout: float = typer.Option(3600.0, "--hub-timeout", help="seconds to wait for each AI Hub job"),
    allow_unverified: Optional[List[str]] = typer.Option(None, "--allow-unverified", help=_ALLOW_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the plan (jobs, formats, precisions, artifact paths) and build nothing"),
    force: bool = typer.Option(False, "--force", help="export even when the output folder holds an unchanged export of the same inputs"),
    verbose: bool = _verbose_option(),
):
    """Export every component of MODEL for TARGET, gate each artifact on parity, write a manifest.

    An unchanged re-export is reused: when OUT/MODEL/TARGET/manifest.json was written by an export
    of exactly these inputs (edgex source, tool versions, weights or checkpoint bytes, seed, --set,
    the planned jobs, gates, threads, --allow-unverified) and every file it records still has its
    sha256 and size, nothing is loaded or rebuilt: that manifest's table and exit code stand.
    Otherwise only the jobs whose own inputs changed are built: an artifact whose component, exporter,
    precision, placement, gates, weights, seed, --set, edgex source and tools are those of an intact
    entry of that manifest keeps it ("reused"). --force rebuilds everything; --hub never reuses."""
    # Every name is checked from light declarations first: torch and the toolchains load only
    # once there is work to do.
    from .parity.gates import parse_overrides
    from .plan import coarse_warning, make_plan
    from .recipes.base import parse_settings
    from .status import check_unverified_kinds

    set_verbose(verbose or is_verbose())
    hub_settings = None
    if hub or hub_device:
        from .hub import HubSettings

        hub_settings = HubSettings(hub_device, hub_timeout)
    try:
        overrides = parse_overrides(min_db)
        recipe_settings = parse_settings(settings)
        allow_unverified = check_unverified_kinds(split_values(allow_unverified))
        from .plan import read_placements

        selection = dict(preset=preset, checkpoint=checkpoint, components=split_values(component), formats=split_values(fmt),
                         precisions=split_values(precision), placements=read_placements(split_values(placement)), calibration_size=calibration,
                         settings=recipe_settings)
        checked = make_plan(model, target, out_dir, **selection)
        for component, why in checked.target.facts.get("not_built", {}).items():
            err.print(f"{component}: not built for {target}: {why}", highlight=False, soft_wrap=True)
        for job in checked.jobs:
            if job.coarse:
                err.print(coarse_warning(model, job), highlight=False, soft_wrap=True)
        if dry_run:  # before the executors' imports: a plan imports no toolchain
            _print_plan(checked, as_json)
            return
        from .build.executors.remote_export import export_runner
        from .side_by_side import default_jobs

        runner = export_runner(executor, address, hub=bool(hub_settings))

        jobs = jobs or default_jobs()
        manifest = None
        if not (force or hub_settings):
            from .artifacts.reuse import unchanged_export

            manifest = unchanged_export(checked, seed=seed, settings=recipe_settings, min_db=overrides, threads=threads,
                                        allow_unverified=allow_unverified)
        if manifest is not None:
            err.print(f"unchanged since {manifest['created']}: reused {len(manifest['artifacts'])} artifact(s) "
                      f"(manifest {manifest['manifest_path']}; --force re-exports)", highlight=False, soft_wrap=True)
        else:
            from .progress import JobCosts, JobProgress

            costs = JobCosts(checked)
            width = err.width if err.is_terminal else PIPED_WIDTH
            with native_output_quiet() as stderr:
                quiet_libraries()
                from .export import export_model

                # reuse=False: looked above already (or --force / --hub)
                options = dict(selection, checkpoint=checked.checkpoint, seed=seed, min_db=overrides, threads=threads,
                               jobs=jobs, max_memory_mb=max_memory * 1024 if max_memory else None, hub=hub_settings, allow_unverified=allow_unverified, reuse=False,
                               reuse_jobs=not force, runner=runner)
                if as_json:
                    manifest = export_model(model, target, out_dir, **options)
                else:
                    with JobProgress(Console(file=stderr, width=width), checked, jobs, costs) as progress:
                        manifest = export_model(model, target, out_dir, progress=progress, **options)
            costs.record(manifest, jobs if len(checked.jobs) > 1 else 1)
            kept = [a for a in manifest["artifacts"] if a.get("reused") and "sidecar_of" not in a]
            if kept:
                across = sum(1 for a in kept if a.get("reused_from"))
                where = ", ".join([*([f"{len(kept) - across} of the earlier export in this folder"] if across < len(kept) else []),
                                   *([f"{across} from {ARTIFACT_CACHE}"] if across else [])])
                err.print(f"reused {len(kept)} unchanged artifact(s) ({where}), built "
                          f"{len(checked.jobs) - len(kept)} (--force rebuilds all)", highlight=False, soft_wrap=True)
    except EdgexError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(manifest, indent=2) + "\n")
    else:
        out.print(summary_table(manifest))
        out.print(f"manifest: {manifest['manifest_path']}")
    failed = failed_lines(manifest["artifacts"])
    _exit(manifest["status"], f"parity gate failed for {len(failed)} artifact(s): {', '.join(failed)}",
          unverified(manifest["artifacts"], lambda a: a.get("parity", {}).get("reason") or a.get("tensor_parity", {}).get("unverified")
                      or a.get("quantized_parity", {}).get("unverified")))


def _print_plan(checked, as_json: bool) -> None:
    """`export --dry-run`: what would be built and where, from the plan alone."""
    if as_json:
        sys.stdout.write(json.dumps(checked.to_json(), indent=2) + "\n")
        return
    from .progress import JobCosts

    table, line = plan_table(checked, JobCosts(checked))
    out.print(table)
    out.print(line, highlight=False)




@app.command()
def sweep(
    model: str = typer.Argument(..., help="model recipe, e.g. qwen3-tts"),
    target: str = typer.Option("cpu", "--target", "-t", help="device profile"),
    precision: Optional[List[str]] = typer.Option(None, "--precision", "-p", help="precisions to sweep, e.g. fp16,w8a16,w8a8,w4a16"),
    calibration: Optional[List[str]] = typer.Option(None, "--calibration", help="calibration sizes for the calibrated schemes, e.g. 8,16,32"),
    component: Optional[List[str]] = typer.Option(None, "--component", "-c", help="only these components"),
    fmt: Optional[List[str]] = typer.Option(None, "--format", "-f", help="only these formats (exporter or format names: executorch or pte, onnx, ...)"),
    placement: Optional[List[str]] = typer.Option(None, "--placement", help=_PLACEMENT_HELP + " (a key given twice is swept in both)"),
    preset: Optional[str] = typer.Option(None, help="seeded random weights of a named config (default: tiny)"),
    checkpoint: Optional[Path] = typer.Option(None, help="local checkpoint folder or cached hub id"),
    seed: int = typer.Option(0, help="seed for preset weights and the eager pipeline"),
    min_db: Optional[List[str]] = typer.Option(None, "--min-db", help=_MIN_DB_HELP),
    settings: Optional[List[str]] = typer.Option(None, "--set", help="recipe build option KEY=VALUE"),
    out_dir: Path = typer.Option(Path("out/sweep"), "--out", "-o", help="output root: the artifacts go to <out>/<model>[-cal<N>]/<target>/, the report (sweep.{md,json,csv,png}, recommended.placement, build.json, junit.xml) to <out>/"),
    cache: Optional[Path] = typer.Option(None, "--cache", help="build cache folder (default: <out>/.edgex-cache)"),
    threads: Optional[int] = _threads_option(),
    executor: str = typer.Option("local", "--executor", help=_EXECUTOR_HELP),
    address: Optional[str] = typer.Option(None, "--address", help=_ADDRESS_HELP),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help=_JOBS_HELP),
    max_memory: Optional[float] = typer.Option(None, "--max-memory", min=0.1, help=_MAX_MEMORY_HELP),
    allow_unverified: Optional[List[str]] = typer.Option(None, "--allow-unverified", help=_ALLOW_HELP),
    in_situ: int = typer.Option(3, "--in-situ", min=0, help="run at most N whole placements, in objective order, through edgex pipeline before recommending one (0: none)"),
    allow_coarse: bool = typer.Option(False, "--allow-coarse", help="let the recommendation name points at a scheme the recipe declares too coarse for the component (verdict 'pass (coarse)'); by default they are left out, and the report says so"),
    frames: Optional[int] = typer.Option(None, "--frames", help="frames (or decode steps) of each in-situ run (default: the model's)"),
    as_json: bool = typer.Option(False, "--json", help="print sweep.json on stdout"),
    verbose: bool = _verbose_option(),
):
    """Export MODEL for TARGET over precisions and calibration sizes (reusing cached artifacts), gate
    each point as export does, and write a table, JSON, CSV, a plot and the recommended placement:
    per component the best passing point by latency where measured, else bytes, the pipeline's stages
    checked in situ as a whole placement (at most --in-situ N tried, in objective order).
    Exit 0 when every component has a recommended point, 1 when one has none (nothing passed, or no
    placement tried passed in situ), 2 on bad input."""
    from .parity.gates import parse_overrides
    from .recipes.base import parse_settings

    set_verbose(verbose or is_verbose())
    try:
        from .build.executors import make_executor
        from .status import check_unverified_kinds
        from .sweep.plan import sweep_jobs

        allowed = tuple(check_unverified_kinds(split_values(allow_unverified)))
        runner = make_executor(executor, address, jobs, max_memory)

        jobs = sweep_jobs(model, target, preset=preset, checkpoint=checkpoint, seed=seed, components=split_values(component),
                          formats=split_values(fmt), precisions=split_values(precision), calibrations=calibration_sizes(calibration),
                          placements=split_values(placement), min_db=parse_overrides(min_db), settings=parse_settings(settings),
                          threads=threads)
        err.print(f"sweep: {len(jobs)} point(s)", highlight=False)
        with native_output_quiet() as stderr:
            quiet_libraries()
            from .recipes import RECIPES
            from .sweep.plot import plot
            from .sweep.recommend import recommend
            from .sweep.report import placement_line, write
            from .sweep.run import in_situ_runner, run_sweep

            lines = Console(file=stderr, width=err.width)  # fd 2 is /dev/null meanwhile (toolchain noise)
            data = run_sweep(jobs, out_dir, cache, threads, progress=lambda m: lines.print(m, highlight=False),
                             allow_unverified=allowed, executor=runner)
            in_situ_run = in_situ_runner(data["rows"], out_dir, frames, threads, lambda m: lines.print(m, highlight=False))
            chosen = recommend(data["rows"], RECIPES.get(model).in_situ_components, placement_line, in_situ_run if in_situ else None,
                               in_situ, allow_coarse)
            summary = write(out_dir, model, target, data, plot, chosen)
    except EdgexError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        out.print((out_dir / "sweep.md").read_text(), highlight=False, markup=False)
        for component, line in summary["recommendation"].items():
            out.print(f"recommended {component}: {line or 'nothing'} ({summary['objective'][component]})", highlight=False)
        for item in summary["left_out"]:
            out.print(f"left out {item['point']}: {item['reason']} (--allow-coarse admits it)", highlight=False)
        situ = summary["in_situ"]
        out.print(f"in situ: {situ['verdict']}" + (f" ({situ['reason']})" if situ.get("reason") else
                                                    f", {len(situ['tried'])} of at most {situ['bound']} placement(s) tried"), highlight=False)
        out.print(f"{len(summary['rows'])} point(s), {summary['reused']} reused; files: "
                  + ", ".join(summary["files"].values()), highlight=False)
    # a component left out because its stage is served by an alternative one (a step graph looped
    # instead of the frame graph) is no failure of the sweep
    if any(line is None and c not in summary["served_by"] for c, line in summary["recommendation"].items()):
        raise typer.Exit(1)


@app.command()
def pipeline(
    model: str = typer.Argument(..., help="model recipe, e.g. qwen3-tts (must match the manifest)"),
    directories: List[Path] = typer.Argument(..., help="folder(s) holding manifest.json (edgex export / sweep / build output); a stage is taken from the first that has it"),
    placement: Optional[List[str]] = typer.Option(None, "--placement", help=_PLACEMENT_HELP + "; picks the artifact that serves a stage (default: the target's), so a key given twice with different values is refused"),
    frames: Optional[int] = typer.Option(None, "--frames", help="frames (TTS) or decode steps (LLM) to generate (default: as many as the tiny graphs hold, at most 40 / 48)"),
    stream_frames: Optional[int] = typer.Option(None, "--stream-frames", help="eager frames for the streaming-schedule comparison (default 122: past the 72-frame left context)"),
    threads: Optional[int] = _threads_option(),
    voice: Optional[Path] = typer.Option(None, "--voice", help="a voice-prompt .npz (edgex voice-prompt) the official-utterance check clones (Base checkpoints; default: a seeded x-vector)"),
    text: Optional[str] = typer.Option(None, "--text", help="the official-utterance check speaks this text, tokenized with the checkpoint's tokenizer (default: seeded token ids)"),
    request: Optional[Path] = typer.Option(None, "--request", help="the official-utterance request as JSON: text or text_ids, language, speaker, instruct or instruct_ids, voice (.npz), non_streaming (docs/runtime-contract.md)"),
    as_json: bool = typer.Option(False, "--json", help="print the pipeline report as JSON"),
    verbose: bool = _verbose_option(),
):
    """In-situ parity: DIR's artifacts composed into MODEL's pipeline against the eager pipeline (same seed
    and noise), teacher-forced and free-running, streaming schedules, timing; gated like a component.
    Writes pipeline.json beside the manifest and a `pipeline` block into it. Exit 0 pass, 1 fail, 2 bad input."""
    set_verbose(verbose or is_verbose())
    try:
        with native_output_quiet() as stderr:
            quiet_libraries()
            from .in_situ import run_pipeline
            from .verify import find_manifest, load_manifest

            for directory in directories:
                recorded = load_manifest(find_manifest(directory))["model"]
                if recorded != model:
                    raise EdgexError(f"{directory} holds {recorded} artifacts, not {model}")
            lines = Console(file=stderr, width=err.width)
            spec = request_spec(request, text, voice)
            report = run_pipeline(directories, split_values(placement), frames, threads,
                                  progress=lambda m: lines.print(m, highlight=False), stream_frames=stream_frames,
                                  voice=voice if spec is None else None, request=spec,
                                  request_base=request.parent if request is not None else Path.cwd())
    except EdgexError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        out.print(pipeline_table(report))
        out.print("artifacts: " + ", ".join(f"{a['component']}.{a['precision']}.{a['format']} ({a['files'][0]['sha256'][:12]})"
                                             for a in report["artifacts"]), highlight=False)
        out.print(f"pipeline: {verdict_cell(report['verdict'])}; report {Path(report['manifest']).parent / 'pipeline.json'}")
        for stage, reason in (report.get("coarse") or {}).items():
            out.print(f"{stage}: a scheme its recipe declares too coarse ({escape(reason)})", highlight=False)
    if not passed(report["verdict"]):
        err.print(f"[red]edgex:[/red] pipeline failed: {escape('; '.join(report['failures']))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)


@app.command()
def verify(
    directory: Path = typer.Argument(..., help="folder holding manifest.json (or an output root)"),
    threads: Optional[int] = _threads_option(),
    as_json: bool = typer.Option(False, "--json", help="print the verification as JSON"),
    allow_unverified: Optional[List[str]] = typer.Option(None, "--allow-unverified", help=_ALLOW_HELP),
    verbose: bool = _verbose_option(),
):
    """Check artifact hashes against the manifest and re-run parity from it."""
    set_verbose(verbose or is_verbose())
    try:
        with native_output_quiet():
            quiet_libraries()
            from .verify import verify_directory

            report = verify_directory(directory, threads=threads, allow_unverified=split_values(allow_unverified))
    except EdgexError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        out.print(verify_table(report))
    _exit(report["status"], f"verification failed: {report['problem_count']} problem(s) in {report['manifest']}",
          unverified(report["artifacts"], lambda a: a.get("reason")))


class _BuildGroup(TyperGroup):
    """`edgex build FILE` runs a build (the `run` subcommand by default); `edgex build merge DIRS` joins shards."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["run", *args]
        return super().parse_args(ctx, args)


build_app = typer.Typer(cls=_BuildGroup, no_args_is_help=True, add_completion=False,
                        help="Build a matrix of models x targets x precisions from a TOML file, with a cache, shards and CI reports.")
app.add_typer(build_app, name="build")


def _build_result(data: dict, out_dir: Path, as_json: bool) -> None:
    from .status import EXIT_CODES

    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
    else:
        out.print(build_table(data))
        reused = sum(1 for a in data["artifacts"] if a["build"]["reused"])
        out.print(f"{len(data['artifacts'])} artifacts ({reused} reused) in {data['build']['seconds']:.1f} s; "
                  f"reports: {out_dir / 'junit.xml'}, {out_dir / 'summary.md'}, {out_dir / 'build.json'}", highlight=False)
    bad = [f"{a['id']} ({a['verdict']})" for a in data["artifacts"] if a["verdict"] != "pass"]
    if data["status"] != "pass":
        err.print(f"[red]edgex:[/red] build {data['status']}: {len(bad)} artifact(s) not passing: {', '.join(bad)}",
                  highlight=False, soft_wrap=True)
    raise typer.Exit(EXIT_CODES[data["status"]])


@build_app.command("run")
def build_run(
    file: Path = typer.Argument(..., help="build file (TOML)"),
    out_dir: Path = typer.Option(Path("out"), "--out", "-o", help="output root: the artifacts go to <out>/<name>/<target>/, the reports (build.json, junit.xml, summary.md) to <out>/"),
    cache: Optional[Path] = typer.Option(None, "--cache", help="cache folder (default: <out>/.edgex-cache)"),
    shard: Optional[str] = typer.Option(None, "--shard", help="run shard I of N of the jobs, e.g. 1/2 (merge with edgex build merge)"),
    costs: Optional[Path] = typer.Option(None, "--costs", help="a previous build.json, build output or build cache: balance shards by its recorded export seconds"),
    executor: str = typer.Option("local", "--executor", help=_EXECUTOR_HELP),
    address: Optional[str] = typer.Option(None, "--address", help=_ADDRESS_HELP),
    jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help=_JOBS_HELP),
    max_memory: Optional[float] = typer.Option(None, "--max-memory", min=0.1, help=_MAX_MEMORY_HELP),
    as_json: bool = typer.Option(False, "--json", help="print build.json on stdout"),
    verbose: bool = _verbose_option(),
):
    """Export every artifact of a build file (reusing unchanged ones from the cache), write reports."""
    set_verbose(verbose or is_verbose())
    try:
        quiet_libraries()
        from .build.run import run_build
        from .build.shard import parse_shard

        from .build.executors import make_executor

        shard_spec = parse_shard(shard) if shard else None
        data = run_build(file, out_dir, cache, shard_spec, costs, progress=lambda m: err.print(m, highlight=False),
                         executor=make_executor(executor, address, jobs, max_memory))
    except EdgexError as exc:
        _fail(exc)
    _build_result(data, out_dir, as_json)


@build_app.command("merge")
def build_merge(
    dirs: List[Path] = typer.Argument(..., help="output folders of edgex build --shard 1/N ... N/N"),
    out_dir: Path = typer.Option(Path("out"), "--out", "-o", help="output root of the merged build: the artifacts go to <out>/<name>/<target>/, the reports to <out>/"),
    as_json: bool = typer.Option(False, "--json", help="print the merged build.json on stdout"),
):
    """Join shard outputs into one tree, one build.json and one set of reports."""
    try:
        from .build.publish import merge

        data = merge(dirs, out_dir)
    except EdgexError as exc:
        _fail(exc)
    _build_result(data, out_dir, as_json)


@app.command("voice-prompt")
def voice_prompt(
    model: str = typer.Argument(..., help="model recipe: qwen3-tts"),
    checkpoint: Path = typer.Option(..., "--checkpoint", help="a Base checkpoint folder (its speaker_encoder and speech tokenizer encoder)"),
    audio: Path = typer.Option(..., "--audio", help="reference speech, a 24 kHz WAV file"),
    out_path: Path = typer.Option(..., "--out", help="the voice-prompt .npz to write"),
    text: Optional[str] = typer.Option(None, "--text", help="the reference audio's transcript, tokenized with the checkpoint's tokenizer: an in-context prompt"),
    ids: Optional[str] = typer.Option(None, "--ids", help="the transcript as comma-separated token ids (instead of --text): an in-context prompt"),
    as_json: bool = typer.Option(False, "--json", help="print what was written as JSON"),
    verbose: bool = _verbose_option(),
):
    """Write a voice prompt (speaker embedding; with a transcript also the reference codes) from reference
    audio with the checkpoint's own encoders, as the official create_voice_clone_prompt does. Without a
    transcript the prompt is x-vector only. Exit 0 written, 2 bad input."""
    set_verbose(verbose or is_verbose())
    try:
        if model != "qwen3-tts":
            raise EdgexError(f"voice prompts are made for qwen3-tts only, not {model!r}")
        id_list = transcript_ids(text, ids)
        with native_output_quiet():
            quiet_libraries()
            from .recipes.qwen3_tts.voice_prompt import write

            written = write(checkpoint, audio, out_path, text, id_list)
    except EdgexError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(written, indent=2) + "\n")
    else:
        out.print(f"voice prompt ({written['mode']}): {escape(written['voice_prompt'])}; speaker embedding "
                  f"{written['speaker_embedding']}, reference frames {written['ref_frames']}", highlight=False)


@app.command("list")
def list_(as_json: bool = typer.Option(False, "--json", help="print as JSON")):
    """Models (presets, components), targets, formats and precisions."""
    from .catalog import catalog

    data = catalog()
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    for shown in catalog_lines(data):
        out.print(shown)


@app.command()
def doctor(
    runtime: list[str] = typer.Option(None, "--runtime", "-r", help="smoke-test only this runtime (repeatable)"),
    as_json: bool = typer.Option(False, "--json", help="print as JSON"),
):
    """Toolchain versions, and each runtime's smoke program run here; exit 1 when a runtime fails."""
    from .catalog import doctor as diagnose

    try:
        data = diagnose(runtime or None)
    except EdgexError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        if not data["ok"]:
            raise typer.Exit(1)
        return
    for shown in doctor_lines(data):
        out.print(shown)
    if not data["ok"]:
        failed = [r["name"] for r in data["runtimes"] if r["status"] == "failed"]
        err.print(f"edgex: doctor: runtime(s) failed their smoke program: {', '.join(failed)}")
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover - console entry point
    app()
