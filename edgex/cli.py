"""`edgex` command line: parses, calls the library, renders with rich. No work happens here."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup

from .errors import EdgexError
from .logs import native_output_quiet, quiet_libraries, set_verbose, verbose as is_verbose

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Turn models into verified on-device artifacts.")
# Piped output (CI logs, `| tee`) gets rich's 80-column default, which folds the summary table into
# truncated cells; a wide fixed width keeps one row per artifact there. A terminal keeps its own width.
_PIPED_WIDTH = 160
err = Console(stderr=True, width=None if sys.stderr.isatty() else _PIPED_WIDTH)
out = Console(width=None if sys.stdout.isatty() else _PIPED_WIDTH)


def _split(values: Optional[List[str]]) -> Optional[List[str]]:
    """Accept repeated options and comma lists alike."""
    if not values:
        return None
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def _db(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return "inf" if math.isinf(value) and value > 0 else f"{value:.1f}"


def source_line(source: dict) -> str:
    """Where the weights came from, for the first line of a summary: a preset is named as seeded
    random weights, so a random-weight artifact is never mistaken for a model."""
    if "checkpoint" in source:
        return f"checkpoint {source['checkpoint']}"
    return f"preset {source.get('preset')}: seeded random weights, seed {source.get('seed', 0)}"


def _summary(manifest: dict) -> Table:
    title = f"{manifest['model']} ({source_line(manifest.get('source') or {})}) -> {manifest['target']}  ({manifest['status'].upper()})"
    table = Table(title=title, title_justify="left")
    device = manifest.get("hub") is not None
    numeric = ("e2e dB", "gate dB", "scheme / lowering dB", "size", "export s", "device dB", "device ms")
    for col in ("component", "format", "precision", "e2e dB", "gate dB", "scheme / lowering dB", "top-1 / tokens", "size", "export s", "method",
                *(("device dB", "device ms") if device else ()), "verdict"):
        table.add_column(col, justify="right" if col in numeric else "left")
    for a in manifest["artifacts"]:
        parity = a.get("parity", {})
        agreement = parity.get("min_token_agreement")
        top1 = [s.get("top1_agreement") for sample in parity.get("samples", {}).values() for s in sample.values() if "top1_agreement" in s]
        agree = " / ".join(x for x in (f"{min(top1):.2f}" if top1 else "", f"{agreement:.2f}" if agreement is not None else "") if x) or "-"
        size = sum(f["bytes"] for f in a.get("files", []))
        colour = {"pass": "green", "fail": "red", "error": "red"}.get(a["verdict"], "yellow")
        table.add_row(
            a["component"], a["format"], a["precision"], _end_to_end(parity), _gate(parity),
            _split_figures(parity), agree, f"{size / 1e6:.2f} MB" if size else "-", f"{a.get('export_seconds', 0):.1f}",
            parity.get("method", "-"), *(_device_cells(a.get("device_parity", {})) if device else ()), f"[{colour}]{a['verdict']}[/{colour}]",
        )
    return table


def _end_to_end(parity: dict) -> str:
    """The deciding figure; where spectral figures gate waveform outputs, their waveform SNR beside
    it (recorded, not deciding); where action outputs are gated by their action error too, that
    error (the worst dimension's, in units of its spread)."""
    waveform = parity.get("min_waveform_snr_db")
    figure = _db(parity.get("min_snr_db"))
    if waveform is not None:
        figure = f"{figure} (waveform SNR {_db(waveform)})"
    action = parity.get("max_action_error")
    return figure if action is None else f"{figure} (action error {_action(action)})"


def _action(value) -> str:
    return value if isinstance(value, str) else f"{value:.3f}"


def _gate(parity: dict) -> str:
    """The gate that decided the verdict, named where there are several (end-to-end, scheme,
    lowering: `edgex.parity.check.deciding_gate`)."""
    gate = parity.get("gate")
    if not gate:
        return _db(parity.get("threshold_db"))
    name = "e2e" if gate["figure"] == "end-to-end" else gate["figure"]
    return f"{_db(gate['threshold_db'])} ({name})" if parity.get("lowering") else _db(gate["threshold_db"])


def _split_figures(parity: dict) -> str:
    """Quantized artifacts: the scheme's figure vs fp32 and the lowering's vs the scheme, each
    against its gate ("-" for float schemes, which have one figure)."""
    parts = [parity.get(k) for k in ("scheme", "lowering")]
    if not all(parts):
        return "-"
    return " / ".join(f"{_db(p.get('min_snr_db'))} ({_db(p.get('threshold_db'))})" for p in parts)


def _device_cells(block: dict) -> tuple[str, str]:
    """On-device SNR and latency from AI Hub, or why there are none."""
    if block.get("method") != "device":
        return ("none" if block else "-"), "-"
    latency = block.get("latency_ms")
    return _db(block.get("min_snr_db")), f"{latency:.2f}" if latency else "-"


def _why_failed(entry: dict) -> str:
    """The first reason an artifact failed, one line: its export error, else its parity's first
    failure (a NaN / inf first, `edgex.parity.check`), its stored tensors', its stored quantized
    tensors' (`edgex.parity.quantized`), or its device run's."""
    from .parity.quantized import summary as quantized_summary  # numpy: not for toolchain-free commands

    reasons = [entry.get("error"), *(entry.get("parity") or {}).get("failures", [])[:1],
               (entry.get("tensor_parity") or {}).get("failure"), quantized_summary(entry.get("quantized_parity")),
               *(entry.get("device_parity") or {}).get("failures", [])[:1]]
    return next((r for r in reasons if r), "no reason recorded")


def _unverified(rows: list[dict], reason) -> list[str]:
    return [f"{a['component']}.{a['precision']}.{a['format']} ({reason(a) or 'no reason given'})" for a in rows if a["verdict"] == "unverified"]


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
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="export in N worker processes (N x memory)"),
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
    Anything else exports again and overwrites; --force always does; --hub never reuses."""
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
        allow_unverified = check_unverified_kinds(_split(allow_unverified))
        from .plan import read_placements

        selection = dict(preset=preset, checkpoint=checkpoint, components=_split(component), formats=_split(fmt),
                         precisions=_split(precision), placements=read_placements(_split(placement)), calibration_size=calibration,
                         settings=recipe_settings)
        checked = make_plan(model, target, out_dir, **selection)
        for job in checked.jobs:
            if job.coarse:
                err.print(coarse_warning(model, job), highlight=False, soft_wrap=True)
        if dry_run:
            _print_plan(checked, as_json)
            return
        manifest = None if force or hub_settings else _unchanged(checked, seed, recipe_settings, overrides, threads, allow_unverified)
        if manifest is not None:
            err.print(f"unchanged since {manifest['created']}: reused {len(manifest['artifacts'])} artifact(s) "
                      f"(manifest {manifest['manifest_path']}; --force re-exports)", highlight=False, soft_wrap=True)
        else:
            from .progress import JobCosts, JobProgress

            costs = JobCosts(checked)
            width = err.width if err.is_terminal else _PIPED_WIDTH
            with native_output_quiet() as stderr:
                quiet_libraries()
                from .export import export_model

                # reuse=False: looked above already (or --force / --hub)
                options = dict(selection, checkpoint=checked.checkpoint, seed=seed, min_db=overrides, threads=threads,
                               jobs=jobs, hub=hub_settings, allow_unverified=allow_unverified, reuse=False)
                if as_json:
                    manifest = export_model(model, target, out_dir, **options)
                else:
                    with JobProgress(Console(file=stderr, width=width), checked, jobs, costs) as progress:
                        manifest = export_model(model, target, out_dir, progress=progress, **options)
            costs.record(manifest, jobs if len(checked.jobs) > 1 else 1)
    except EdgexError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(manifest, indent=2) + "\n")
    else:
        out.print(_summary(manifest))
        out.print(f"manifest: {manifest['manifest_path']}")
    failed = [f"{a['component']}.{a['precision']}.{a['format']} ({_why_failed(a)})" for a in manifest["artifacts"]
              if a["verdict"] in ("fail", "error")]
    _exit(manifest["status"], f"parity gate failed for {len(failed)} artifact(s): {', '.join(failed)}",
          _unverified(manifest["artifacts"], lambda a: a.get("parity", {}).get("reason") or a.get("tensor_parity", {}).get("unverified")
                      or a.get("quantized_parity", {}).get("unverified")))


def _unchanged(checked, seed, settings, overrides, threads, allow_unverified) -> dict | None:
    """The manifest of an unchanged earlier export into the plan's folder (`edgex.artifacts.reuse`),
    found before the export pipeline (torch, the toolchains) is imported: a hit takes about a second.
    Gate overrides are checked first, as `export_model` checks them: bad input fails either way."""
    from .artifacts.reuse import export_key, unchanged
    from .parity.gates import check_overrides

    check_overrides(overrides, set(checked.recipe.components.values()))
    key = export_key(checked, seed=seed, settings=settings, min_db=overrides, threads=threads, allow_unverified=allow_unverified)
    return unchanged(checked.out_dir, key)


def _print_plan(checked, as_json: bool) -> None:
    """`export --dry-run`: what would be built and where, from the plan alone."""
    if as_json:
        sys.stdout.write(json.dumps(checked.to_json(), indent=2) + "\n")
        return
    from .progress import JobCosts, clock

    costs = JobCosts(checked)
    plan = checked.to_json()
    source = ", ".join(f"{k} {v}" for k, v in plan["source"].items())
    table = Table(title=f"plan: {plan['model']} ({source}) -> {plan['target']}  (dry run, nothing built)")
    for col in ("component", "role", "format", "precision", "artifact", "recorded s"):
        table.add_column(col, justify="right" if col == "recorded s" else "left")
    for job, row in zip(checked.jobs, plan["jobs"]):
        cost = costs.get(job)
        table.add_row(row["component"], row["role"], row["format"], row["precision"], row["path"],
                      f"{cost:.0f}" if cost is not None else "-")
    out.print(table)
    known = [c for c in map(costs.get, checked.jobs) if c is not None]
    out.print(f"{len(checked.jobs)} job(s); failing artifacts would land under {checked.out_dir / 'failed'}"
              + (f"; recorded cost of {len(known)} of them: {clock(sum(known))} on one worker" if known else ""), highlight=False)


def _sizes(values: Optional[List[str]]) -> Optional[List[int]]:
    sizes = []
    for text in _split(values) or []:
        if not text.isdigit() or int(text) < 1:
            raise EdgexError(f"bad --calibration {text!r}: expected positive integers, e.g. 8,16,32")
        sizes.append(int(text))
    return sizes or None


_EXECUTOR_HELP = "where uncached jobs run: local (here, one after another) or ray (one Ray task each, docs/ray.md)"
_ADDRESS_HELP = ("with --executor ray: an existing Ray cluster (host:port of its head, auto, or ray://HOST:PORT); "
                 "default: an embedded Ray instance on this machine, loopback only")


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
    allow_unverified: Optional[List[str]] = typer.Option(None, "--allow-unverified", help=_ALLOW_HELP),
    in_situ: int = typer.Option(3, "--in-situ", min=0, help="run at most N whole placements, in objective order, through edgex pipeline before recommending one (0: none)"),
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

        allowed = tuple(check_unverified_kinds(_split(allow_unverified)))
        runner = make_executor(executor, address)

        jobs = sweep_jobs(model, target, preset=preset, checkpoint=checkpoint, seed=seed, components=_split(component),
                          formats=_split(fmt), precisions=_split(precision), calibrations=_sizes(calibration),
                          placements=_split(placement), min_db=parse_overrides(min_db), settings=parse_settings(settings),
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
                               in_situ)
            summary = write(out_dir, model, target, data, plot, chosen)
    except EdgexError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    else:
        out.print((out_dir / "sweep.md").read_text(), highlight=False, markup=False)
        for component, line in summary["recommendation"].items():
            out.print(f"recommended {component}: {line or 'nothing'} ({summary['objective'][component]})", highlight=False)
        situ = summary["in_situ"]
        out.print(f"in situ: {situ['verdict']}" + (f" ({situ['reason']})" if situ.get("reason") else
                                                    f", {len(situ['tried'])} of at most {situ['bound']} placement(s) tried"), highlight=False)
        out.print(f"{len(summary['rows'])} point(s), {summary['reused']} reused; files: "
                  + ", ".join(summary["files"].values()), highlight=False)
    if any(line is None for line in summary["recommendation"].values()):
        raise typer.Exit(1)


def _figure(value) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {_figure(v)}" for k, v in value.items()) + "}"
    return str(value)


def _pipeline_table(report: dict) -> Table:
    """One row per figure group of the pipeline report (pipeline.json has them all)."""
    table = Table(title=f"pipeline {report['model']} -> {report['target']}  ({report['verdict'].upper()})")
    for col in ("part", "stage / schedule", "figures"):
        table.add_column(col)
    for part in ("teacher_forced", "free_running", "streaming", "timing"):
        for item, value in (report.get(part) or {}).items():
            figures = ", ".join(f"{k} {_figure(v)}" for k, v in value.items()) if isinstance(value, dict) else _figure(value)
            table.add_row(part.replace("_", "-"), item, escape(figures))
    return table


def _request_spec(path: Optional[Path], text: Optional[str], voice: Optional[Path]) -> Optional[dict]:
    """The official-utterance request of `edgex pipeline`: a JSON file, or --text (with --voice)."""
    if path is None:
        return None if text is None else {"text": text, **({"voice": str(voice.resolve())} if voice is not None else {})}
    if text is not None or voice is not None:
        raise EdgexError("--request holds the whole request: give text and voice inside it, not as --text / --voice")
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EdgexError(f"--request {path}: not a readable JSON file ({exc})") from None
    if not isinstance(spec, dict):
        raise EdgexError(f"--request {path}: expected a JSON object")
    return spec


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
            spec = _request_spec(request, text, voice)
            report = run_pipeline(directories, _split(placement), frames, threads,
                                  progress=lambda m: lines.print(m, highlight=False), stream_frames=stream_frames,
                                  voice=voice if spec is None else None, request=spec,
                                  request_base=request.parent if request is not None else Path.cwd())
    except EdgexError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        out.print(_pipeline_table(report))
        out.print("artifacts: " + ", ".join(f"{a['component']}.{a['precision']}.{a['format']} ({a['files'][0]['sha256'][:12]})"
                                             for a in report["artifacts"]), highlight=False)
        colour = "green" if report["verdict"] == "pass" else "red"
        out.print(f"pipeline: [{colour}]{report['verdict']}[/{colour}]; report {Path(report['manifest']).parent / 'pipeline.json'}")
    if report["verdict"] != "pass":
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

            report = verify_directory(directory, threads=threads, allow_unverified=_split(allow_unverified))
    except EdgexError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        table = Table(title=f"verify {report['manifest']}  ({report['status'].upper()})")
        for col in ("component", "format", "precision", "files", "e2e dB", "gate dB", "verdict", "problem"):
            table.add_column(col)
        for a in report["artifacts"]:
            colour = {"pass": "green", "unverified": "yellow"}.get(a["verdict"], "red")
            table.add_row(a["component"], a["format"], a["precision"], a["files"], _db(a.get("min_snr_db")),
                          _gate(a), f"[{colour}]{a['verdict']}[/{colour}]",
                          "; ".join(x for x in (a.get("problem"), a.get("note")) if x))
        out.print(table)
    _exit(report["status"], f"verification failed: {report['problem_count']} problem(s) in {report['manifest']}",
          _unverified(report["artifacts"], lambda a: a.get("reason")))


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
        table = Table(title=f"edgex build ({data['status'].upper()})")
        for col in ("artifact", "min SNR dB", "gate dB", "method", "reused", "s", "verdict"):
            table.add_column(col, justify="right" if col in ("min SNR dB", "gate dB", "s") else "left")
        for a in data["artifacts"]:
            colour = {"pass": "green", "fail": "red", "error": "red"}.get(a["verdict"], "yellow")
            parity = a.get("parity", {})
            table.add_row(f"{a['id']} ({a['format']})", _db(parity.get("min_snr_db")),
                          _db(parity.get("threshold_db")), parity.get("method", "-"), "yes" if a["build"]["reused"] else "no",
                          f"{a['build']['seconds']:.1f}", f"[{colour}]{a['verdict']}[/{colour}]")
        out.print(table)
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
    costs: Optional[Path] = typer.Option(None, "--costs", help="a previous build.json: balance shards by its recorded export seconds"),
    executor: str = typer.Option("local", "--executor", help=_EXECUTOR_HELP),
    address: Optional[str] = typer.Option(None, "--address", help=_ADDRESS_HELP),
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
                         executor=make_executor(executor, address))
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
        if text is not None and ids is not None:
            raise EdgexError("give the transcript as --text or as --ids, not both")
        try:
            id_list = None if ids is None else [int(i) for i in ids.split(",") if i.strip()]
        except ValueError:
            raise EdgexError(f"--ids {ids!r}: expected comma-separated integers") from None
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
    for name, model in data["models"].items():
        table = Table(title=f"model {name}: {model['description']}")
        table.add_column("component")
        table.add_column("role")
        for comp, role in model["components"].items():
            table.add_row(comp, role)
        out.print(table)
        out.print("presets: " + ", ".join(f"[bold]{p}[/bold] ({d})" for p, d in model["presets"].items()))
        if model["options"]:
            out.print("options (--set KEY=VALUE): " + ", ".join(f"[bold]{k}[/bold] ({d})" for k, d in model["options"].items()))
    for title, key, cols in (
        ("targets", "targets", ("description",)),
        ("formats", "formats", ("format", "backend", "runtime", "precisions")),
        ("precisions", "precisions", ("weights", "activations", "granularity", "description")),
    ):
        table = Table(title=title)
        table.add_column("name")
        for col in cols:
            table.add_column(col)
        for name, row in data[key].items():
            table.add_row(name, *[", ".join(row[c]) if isinstance(row[c], list) else str(row[c]) for c in cols])
        out.print(table)
    # The same precision name can mean different things per format (fp16 weights only on MNN,
    # three int8 weight schemes called w8): one line per format and scheme says which.
    table = Table(title="schemes per format (what each precision means there)")
    for col in ("format", "precision", "meaning"):
        table.add_column(col)
    for name, row in data["formats"].items():
        for precision, meaning in row["schemes"].items():
            table.add_row(name, precision, meaning)
    out.print(table)


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
    box = data["machine"]
    out.print(f"machine: {box['cpus']} cores, {box['memory_gb']} GB memory ({box['memory_available_gb']} GB available), "
              f"{box['temp_free_gb']} GB free in {box['temp_dir']}")
    table = Table(title="edgex doctor")
    for col in ("package", "version", "status", "needed for"):
        table.add_column(col)
    for row in data["packages"]:
        colour = "green" if row["version"] else "yellow"
        table.add_row(row["package"], row["version"] or "-", f"[{colour}]{'ok' if row['version'] else 'missing: ' + row['install']}[/{colour}]", row["needed_for"])
    out.print(table)
    colours = {"ok": "green", "missing": "yellow", "failed": "red"}
    for row in data["runtimes"]:
        colour = colours[row["status"]]
        out.print(f"runtime {row['name']} ({row['version'] or 'version unknown'}): [{colour}]{row['status']}[/{colour}] {escape(row['detail'])}")
    if not data["ok"]:
        failed = [r["name"] for r in data["runtimes"] if r["status"] == "failed"]
        err.print(f"edgex: doctor: runtime(s) failed their smoke program: {', '.join(failed)}")
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover - console entry point
    app()
