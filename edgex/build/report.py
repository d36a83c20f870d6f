"""What CI reads from a build: JUnit XML (one test case per artifact), a JSON summary and a
Markdown summary for the job page (`$GITHUB_STEP_SUMMARY`).

Every one of them carries an artifact's verdict as the manifest does, "pass (coarse)" included (a
scheme its recipe declares too coarse for the component, built on request: `edgex.status`): JUnit
has no outcome of its own for it, so its test case passes with a `verdict` property and a
`coarse_scheme` property giving the reason, and its output line starts with the verdict."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

from ..render import gate as gate_text
from ..status import COARSE_PASS, VERDICTS

def _db(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return "inf" if math.isinf(value) else f"{value:.1f}"


def case_name(artifact: dict) -> str:
    return f"{artifact['component']}.{artifact['precision']}.{artifact['format']}"


def failure_text(artifact: dict) -> tuple[str, str]:
    """One-line message and the detail: measured against required dB, per sample and output."""
    parity = artifact.get("parity", {})
    gate = parity.get("threshold_db")
    lines = []
    for sample, outputs in parity.get("samples", {}).items():
        for output, scores in outputs.items():
            spectral = "spectral_db" in scores  # a waveform gated by its spectral figure, its SNR recorded
            figure = scores.get("spectral_db" if spectral else "snr_db")
            below = isinstance(figure, (int, float)) and gate is not None and figure < gate
            what = f"spectral {_db(figure)} dB (waveform SNR {_db(scores.get('snr_db'))} dB)" if spectral else f"{_db(figure)} dB"
            lines.append(f"{'FAIL' if below else 'ok  '} {sample}/{output}: {what} (required {_db(gate)} dB)")
    agreement, required = parity.get("min_token_agreement"), parity.get("token_threshold")
    if agreement is not None and required is not None:
        lines.append(f"token agreement {agreement:.3f} (required {required:.3f})")
    device = artifact.get("device_parity") or {}
    if device.get("verdict") == "fail":
        lines.append(f"on device: {_db(device.get('min_snr_db'))} dB (required {_db(gate)} dB)")
    message = f"min SNR {_db(parity.get('min_snr_db'))} dB, required {_db(gate)} dB ({parity.get('method', '-')})"
    deciding = artifact.get("gate") or parity.get("gate") or {}
    if artifact.get("verdict") == "fail" and (deciding.get("figure"), deciding.get("check")) not in ((None, None), ("end-to-end", "SNR")):
        message = f"{gate_text(artifact)}: {_first_reason(artifact)} ({parity.get('method', '-')})"
    return message, "\n".join(lines)


def _first_reason(artifact: dict) -> str:
    """The first recorded reason an artifact failed, in the order of its blocks (its parity run, its
    stored tensors, its stored quantized tensors, its device run)."""
    reasons = [*(artifact.get("parity") or {}).get("failures", [])[:1], (artifact.get("tensor_parity") or {}).get("failure"),
               *(artifact.get("quantized_parity") or {}).get("failures", [])[:1],
               *(artifact.get("device_parity") or {}).get("failures", [])[:1]]
    return next((r for r in reasons if r), "no reason recorded")


def junit_xml(summary: dict, artifacts: list[dict]) -> bytes:
    """JUnit: a suite per output folder (model/target), a case per artifact. Reused artifacts say so
    in their properties; their figures are those measured when the cached export was made."""
    root = ET.Element("testsuites", name="edgex build", time=f"{summary['seconds']:.3f}")
    suites: dict[str, ET.Element] = {}
    for a in artifacts:
        suite = suites.get(a["folder"])
        if suite is None:
            suite = suites[a["folder"]] = ET.SubElement(root, "testsuite", name=a["folder"])
        case = ET.SubElement(suite, "testcase", classname=f"edgex.{a['folder'].replace('/', '.')}", name=case_name(a),
                             time=f"{a['build']['seconds']:.3f}")
        props = ET.SubElement(case, "properties")
        for key in ("key", "reused", "export_seconds"):
            ET.SubElement(props, "property", name=key, value=str(a["build"][key]))
        ET.SubElement(props, "property", name="method", value=str(a.get("parity", {}).get("method", "-")))
        ET.SubElement(props, "property", name="verdict", value=a["verdict"])
        ET.SubElement(props, "property", name="gate", value=gate_text(a))
        if a.get("coarse_scheme"):
            ET.SubElement(props, "property", name="coarse_scheme", value=a["coarse_scheme"])
        verdict = a["verdict"]
        if verdict == "fail":
            message, detail = failure_text(a)
            ET.SubElement(case, "failure", message=message, type="parity").text = detail
        elif verdict == "error":
            ET.SubElement(case, "error", message=a.get("error", "export error"), type="export").text = a.get("error", "")
        elif verdict == "unverified":
            ET.SubElement(case, "skipped", message=f"unverified: {a.get('parity', {}).get('reason') or 'no runtime ran it'}")
        message, _ = failure_text(a)
        ET.SubElement(case, "system-out").text = (f"{verdict}: {message}; {'reused' if a['build']['reused'] else 'exported'}, "
                                                  f"key {a['build']['key']}"
                                                  + (f"; coarse scheme: {a['coarse_scheme']}" if a.get("coarse_scheme") else ""))
    for suite in suites.values():
        cases = suite.findall("testcase")
        suite.set("tests", str(len(cases)))
        for tag, attr in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            suite.set(attr, str(sum(1 for c in cases if c.find(tag) is not None)))
        suite.set("time", f"{sum(float(c.get('time')) for c in cases):.3f}")
    for attr in ("tests", "failures", "errors", "skipped"):
        root.set(attr, str(sum(int(s.get(attr)) for s in suites.values())))
    ET.indent(root)
    return ET.tostring(root, encoding="utf-8", xml_declaration=True) + b"\n"


def summary_json(build: dict, artifacts: list[dict]) -> dict:
    rows = [{
        "id": a["id"], "verdict": a["verdict"], "min_snr_db": a.get("parity", {}).get("min_snr_db"),
        "gate_db": a.get("parity", {}).get("threshold_db"), "gate": gate_text(a), "method": a.get("parity", {}).get("method"),
        "reused": a["build"]["reused"], "seconds": a["build"]["seconds"],
        "bytes": sum(f["bytes"] for f in a.get("files", [])), "reproducible": a["build"].get("reproducible"),
        **({"error": a["error"]} if "error" in a else {}),
        **({"coarse_scheme": a["coarse_scheme"]} if a.get("coarse_scheme") else {}),
    } for a in artifacts]
    counts = {v: sum(1 for a in artifacts if a["verdict"] == v) for v in VERDICTS}
    return {"status": build["status"], "seconds": build["seconds"], "jobs": build["jobs"],
            "artifacts": len(artifacts), "counts": counts,
            "reused": sum(1 for a in artifacts if a["build"]["reused"]), "artifact_rows": rows}


def summary_markdown(summary: dict) -> str:
    icon = {"pass": "✅", COARSE_PASS: "🔶", "fail": "❌", "error": "💥", "unverified": "⚠️"}
    c = {v: summary["counts"].get(v, 0) for v in VERDICTS}
    lines = [
        f"## edgex build: {summary['status'].upper()}",
        "",
        f"{summary['artifacts']} artifacts from {summary['jobs']} jobs in {summary['seconds']:.0f} s: "
        f"{c['pass']} pass, {c[COARSE_PASS]} pass (coarse), {c['fail']} fail, {c['error']} error, {c['unverified']} unverified; "
        f"{summary['reused']} reused from the cache.",
        "",
        "| artifact | verdict | min SNR dB | gate | method | reused | s |",
        "|---|---|---:|---:|---|---|---:|",
    ]
    order = {"fail": 0, "error": 1, "unverified": 2, COARSE_PASS: 3, "pass": 4}
    for r in sorted(summary["artifact_rows"], key=lambda r: (order.get(r["verdict"], 5), r["id"])):
        gate = r.get("gate") or _db(r["gate_db"])
        lines.append(f"| `{r['id']}` | {icon.get(r['verdict'], '')} {r['verdict']} | {_db(r['min_snr_db'])} | {gate} | "
                     f"{r['method'] or '-'} | {'yes' if r['reused'] else 'no'} | {r['seconds']:.1f} |")
    coarse = [r for r in summary["artifact_rows"] if r["verdict"] == COARSE_PASS]
    if coarse:
        lines += ["", "Passed at a scheme the recipe declares too coarse (built on request):", ""]
        lines += [f"- `{r['id']}`: {r.get('coarse_scheme', '')}" for r in coarse]
    errors = [r for r in summary["artifact_rows"] if r.get("error")]
    if errors:
        lines += ["", "Errors:", ""] + [f"- `{r['id']}`: {r['error']}" for r in errors]
    return "\n".join(lines) + "\n"
