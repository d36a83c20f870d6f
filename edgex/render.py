"""What the commands print: rich tables and lines built from a manifest, report or plan (a pure
function of the data; the command decides where it goes)."""

from __future__ import annotations

import math

from rich.markup import escape
from rich.table import Table

# Piped output (CI logs, `| tee`) gets rich's 80-column default, which folds the summary table into
# truncated cells; a wide fixed width keeps one row per artifact there. A terminal keeps its own width.
PIPED_WIDTH = 160


def db(value) -> str:
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


def summary_table(manifest: dict) -> Table:
    """`edgex export`'s table: one row per artifact of a manifest."""
    title = f"{manifest['model']} ({source_line(manifest.get('source') or {})}) -> {manifest['target']}  ({manifest['status'].upper()})"
    table = Table(title=title, title_justify="left")
    device = manifest.get("hub") is not None
    numeric = ("e2e dB", "gate", "scheme / lowering dB", "size", "export s", "device dB", "device ms")
    for col in ("component", "format", "precision", "e2e dB", "gate", "scheme / lowering dB", "top-1 / tokens", "size", "export s", "method",
                *(("device dB", "device ms") if device else ()), "verdict"):
        table.add_column(col, justify="right" if col in numeric else "left")
    for a in manifest["artifacts"]:
        parity = a.get("parity", {})
        agreement = parity.get("min_token_agreement")
        top1 = [s.get("top1_agreement") for sample in parity.get("samples", {}).values() for s in sample.values() if "top1_agreement" in s]
        agree = " / ".join(x for x in (f"{min(top1):.2f}" if top1 else "", f"{agreement:.2f}" if agreement is not None else "") if x) or "-"
        size = sum(f["bytes"] for f in a.get("files", []))
        table.add_row(
            a["component"], a["format"], a["precision"], _end_to_end(parity), gate(a),
            _split_figures(parity), agree, f"{size / 1e6:.2f} MB" if size else "-", f"{a.get('export_seconds', 0):.1f}",
            parity.get("method", "-"), *(_device_cells(a.get("device_parity", {})) if device else ()), verdict_cell(a["verdict"]),
        )
    return table


def _end_to_end(parity: dict) -> str:
    """The deciding figure; where spectral figures gate waveform outputs, their waveform SNR
    (recorded) and correlation with the reference (gated) beside it; where action outputs are gated by their action error too, that
    error (the worst dimension's, in units of its spread)."""
    waveform = parity.get("min_waveform_snr_db")
    figure = db(parity.get("min_snr_db"))
    if waveform is not None:
        figure = f"{figure} (waveform SNR {db(waveform)}, correlation {_value(parity.get('min_waveform_correlation'))})"
    action = parity.get("max_action_error")
    return figure if action is None else f"{figure} (action error {_action(action)})"


def _action(value) -> str:
    return value if isinstance(value, str) else f"{value:.3f}"


def gate(row: dict) -> str:
    """The check that decided a verdict (a manifest entry's or a verify row's `gate`, else its parity
    block's): a dB gate, with its figure named where there are several (e2e, scheme, lowering, fp32
    graph, stored tensors); any other check (a token flip, in tie margins; a waveform correlation;
    an action error) with its figure against its limit."""
    parity = row.get("parity") or row
    found = row.get("gate") or parity.get("gate")
    if not found:
        return db(parity.get("threshold_db"))
    name = "e2e" if found["figure"] == "end-to-end" else found["figure"]
    if found.get("check", "SNR") == "SNR":
        named = parity.get("lowering") or found["figure"] != "end-to-end"
        return f"{db(found['threshold_db'])} ({name})" if named else db(found["threshold_db"])
    return f"{name} {found['check']} {_value(found.get('value'))} vs {_value(found.get('limit'))}"


def _value(value) -> str:
    if value is None or isinstance(value, str):
        return value or "-"
    return "inf" if math.isinf(value) else f"{value:.3g}"


VERDICT_COLOURS = {"pass": "green", "pass (coarse)": "yellow", "fail": "red", "error": "red", "unverified": "yellow"}


def verdict_cell(verdict: str) -> str:
    colour = VERDICT_COLOURS.get(verdict, "yellow")
    return f"[{colour}]{escape(verdict)}[/{colour}]"


def _split_figures(parity: dict) -> str:
    """Quantized artifacts: the scheme's figure vs fp32 and the lowering's vs the scheme, each
    against its gate ("-" for float schemes, which have one figure)."""
    parts = [parity.get(k) for k in ("scheme", "lowering")]
    if not all(parts):
        return "-"
    return " / ".join(f"{db(p.get('min_snr_db'))} ({db(p.get('threshold_db'))})" for p in parts)


def _device_cells(block: dict) -> tuple[str, str]:
    """On-device SNR and latency from AI Hub, or why there are none."""
    if block.get("method") != "device":
        return ("none" if block else "-"), "-"
    latency = block.get("latency_ms")
    return db(block.get("min_snr_db")), f"{latency:.2f}" if latency else "-"


def why_failed(entry: dict) -> str:
    """The first reason an artifact failed, one line: its export error, else its parity's first
    failure (a NaN / inf first, `edgex.parity.check`), its stored tensors', its stored quantized
    tensors' (`edgex.parity.quantized`), or its device run's."""
    from .parity.quantized import summary as quantized_summary  # numpy: not for toolchain-free commands

    reasons = [entry.get("error"), *(entry.get("parity") or {}).get("failures", [])[:1],
               (entry.get("tensor_parity") or {}).get("failure"), quantized_summary(entry.get("quantized_parity")),
               *(entry.get("device_parity") or {}).get("failures", [])[:1]]
    return next((r for r in reasons if r), "no reason recorded")


def unverified(rows: list[dict], reason) -> list[str]:
    return [f"{a['component']}.{a['precision']}.{a['format']} ({reason(a) or 'no reason given'})" for a in rows if a["verdict"] == "unverified"]




def failed_lines(artifacts: list[dict]) -> list[str]:
    """`component.precision.format (first reason)` of each failed or errored artifact."""
    return [f"{a['component']}.{a['precision']}.{a['format']} ({why_failed(a)})" for a in artifacts if a["verdict"] in ("fail", "error")]


def plan_table(checked, costs) -> tuple[Table, str]:
    """`export --dry-run`: what would be built and where, from the plan alone, with each job's
    recorded cost (`edgex.progress.JobCosts`); and the line under the table."""
    from .progress import clock

    plan = checked.to_json()
    source = ", ".join(f"{k} {v}" for k, v in plan["source"].items())
    table = Table(title=f"plan: {plan['model']} ({source}) -> {plan['target']}  (dry run, nothing built)")
    for col in ("component", "role", "format", "precision", "artifact", "recorded s"):
        table.add_column(col, justify="right" if col == "recorded s" else "left")
    for job, row in zip(checked.jobs, plan["jobs"]):
        cost = costs.get(job)
        table.add_row(row["component"], row["role"], row["format"], row["precision"], row["path"],
                      f"{cost:.0f}" if cost is not None else "-")
    known = [c for c in map(costs.get, checked.jobs) if c is not None]
    line = (f"{len(checked.jobs)} job(s); failing artifacts would land under {checked.out_dir / 'failed'}"
            + (f"; recorded cost of {len(known)} of them: {clock(sum(known))} on one worker" if known else ""))
    return table, line


def _figure(value) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} {_figure(v)}" for k, v in value.items()) + "}"
    return str(value)


def pipeline_table(report: dict) -> Table:
    """One row per figure group of the pipeline report (pipeline.json has them all)."""
    table = Table(title=f"pipeline {report['model']} -> {report['target']}  ({report['verdict'].upper()})")
    for col in ("part", "stage / schedule", "figures"):
        table.add_column(col)
    for part in ("teacher_forced", "free_running", "streaming", "timing"):
        for item, value in (report.get(part) or {}).items():
            figures = ", ".join(f"{k} {_figure(v)}" for k, v in value.items()) if isinstance(value, dict) else _figure(value)
            table.add_row(part.replace("_", "-"), item, escape(figures))
    return table


def verify_table(report: dict) -> Table:
    """`edgex verify`'s table: one row per artifact of the verification report."""
    table = Table(title=f"verify {report['manifest']}  ({report['status'].upper()})")
    for col in ("component", "format", "precision", "files", "e2e dB", "gate", "verdict", "problem"):
        table.add_column(col)
    for a in report["artifacts"]:
        table.add_row(a["component"], a["format"], a["precision"], a["files"], db(a.get("min_snr_db")),
                      gate(a), verdict_cell(a["verdict"]),
                      "; ".join(x for x in (a.get("problem"), a.get("note")) if x))
    return table


def build_table(data: dict) -> Table:
    """`edgex build`'s table: one row per artifact of build.json."""
    table = Table(title=f"edgex build ({data['status'].upper()})")
    for col in ("artifact", "min SNR dB", "gate", "method", "reused", "s", "verdict"):
        table.add_column(col, justify="right" if col in ("min SNR dB", "gate", "s") else "left")
    for a in data["artifacts"]:
        parity = a.get("parity", {})
        table.add_row(f"{a['id']} ({a['format']})", db(parity.get("min_snr_db")),
                      gate(a), parity.get("method", "-"), "yes" if a["build"]["reused"] else "no",
                      f"{a['build']['seconds']:.1f}", verdict_cell(a["verdict"]))
    return table


def catalog_lines(data: dict) -> list:
    """`edgex list`: per model its components table, presets and options; then the targets,
    formats, precisions and each format's schemes (`edgex.catalog.catalog`)."""
    shown: list = []
    for name, model in data["models"].items():
        table = Table(title=f"model {name}: {model['description']}")
        table.add_column("component")
        table.add_column("role")
        for comp, role in model["components"].items():
            table.add_row(comp, role)
        shown.append(table)
        shown.append("presets: " + ", ".join(f"[bold]{p}[/bold] ({d})" for p, d in model["presets"].items()))
        if model["options"]:
            shown.append("options (--set KEY=VALUE): " + ", ".join(f"[bold]{k}[/bold] ({d})" for k, d in model["options"].items()))
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
        shown.append(table)
    # The same precision name can mean different things per format (fp16 weights only on MNN,
    # three int8 weight schemes called w8): one line per format and scheme says which.
    table = Table(title="schemes per format (what each precision means there)")
    for col in ("format", "precision", "meaning"):
        table.add_column(col)
    for name, row in data["formats"].items():
        for precision, meaning in row["schemes"].items():
            table.add_row(name, precision, meaning)
    shown.append(table)
    return shown


def doctor_lines(data: dict) -> list:
    """`edgex doctor`: the machine, the packages table, one line per runtime's smoke program."""
    box = data["machine"]
    shown: list = [f"machine: {box['cpus']} cores, {box['memory_gb']} GB memory ({box['memory_available_gb']} GB available), "
                   f"{box['temp_free_gb']} GB free in {box['temp_dir']}",
                   f"cpu: {escape(box['cpu'])}; {' '.join(box['cpu_features']) or 'no SIMD features reported'}"]
    table = Table(title="edgex doctor")
    for col in ("package", "version", "status", "needed for"):
        table.add_column(col)
    for row in data["packages"]:
        colour = "green" if row["version"] else "yellow"
        table.add_row(row["package"], row["version"] or "-", f"[{colour}]{'ok' if row['version'] else 'missing: ' + row['install']}[/{colour}]", row["needed_for"])
    shown.append(table)
    colours = {"ok": "green", "missing": "yellow", "failed": "red"}
    for row in data["runtimes"]:
        colour = colours[row["status"]]
        shown.append(f"runtime {row['name']} ({row['version'] or 'version unknown'}): [{colour}]{row['status']}[/{colour}] {escape(row['detail'])}")
    shown.append(patches_table(data["patches"]))
    return shown


def patches_table(rows: list[dict]) -> Table:
    """Each patch of another library's internals (`edgex.patches`): on or off here, what it
    replaces, the versions it was checked against and whether the installed ones differ."""
    table = Table(title="patches of other libraries (EDGEX_THIRD_PARTY_PATCHES=off turns the speed-ups off)")
    for col in ("patch", "kind", "state", "checked against", "replaces or reads"):
        table.add_column(col)
    for row in rows:
        checked = ", ".join(f"{d} {v}" + ("" if row["installed"][d] in (None, v) else f" [yellow](installed {row['installed'][d]})[/yellow]")
                            for d, v in row["checked"].items())
        colour = "green" if row["state"] == "on" else "yellow"
        table.add_row(row["name"], row["kind"], f"[{colour}]{row['state']}[/{colour}]", checked, escape(", ".join(row["symbols"])))
    return table
