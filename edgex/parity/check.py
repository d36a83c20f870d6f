"""Run an artifact on every sample of its component and score it against a reference.

Scoring (`score_sample`) takes the reference as a callable `(inputs, forced tokens | None) ->
outputs`: the eager model by default (`Component.eager`), another reference (a quantized eager
model) for other figures. Every output is scored over every step:

- A sampled TOKENS output that differs from the reference's makes the reference run again,
  teacher-forced on the artifact's own tokens, so every other output is compared on the same
  history. A differing token then passes only as a tie-break (`tie_margin`, at
  `gates.tie_db`: 30 dB or a stricter gate, never a loose policy gate); any other flip fails.
- LOGITS are scored by SNR and their top-1 flips go through the same tie rule.
- State outputs a component declares in `written` are scored on the entries the call writes; the
  copied rest is a separate figure (`copied_snr_db`), so copies cannot inflate the written SNR.
- Waveform outputs a component declares `spectral` (their phase is free) are gated by their
  phase-insensitive spectral figure (`metrics.spectral_db`), which a sign flip or a shift leaves
  as it is, and by their correlation with the reference (`metrics.cosine`, at least
  `gates.WAVEFORM_CORRELATION`), which those fail; their SNR is recorded beside them.
- Action outputs a component declares in `actions` (a policy's unnormalized actions) are also
  scored by their action error (`metrics.action_error`: per dimension, RMS over the chunk, in units
  of that dimension's spread), gated at `gates.ACTION_ERROR`: an SNR over the chunk weighs the
  dimensions by their magnitudes, and a loose SNR gate lets a wrong small-valued dimension through.
- A NaN or inf fails, with its own reason first on the report: in the artifact's output (its
  figures are -inf) or in the reference (nothing can be compared with it).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import torch

from ..component import LOGITS, TOKENS, Component, Inputs, TensorSpec
from ..artifacts.files import strict_json
from . import metrics
from .gates import ACTION_ERROR, WAVEFORM_CORRELATION, tie_db
from .runtimes.base import Session

Reference = Callable[[Inputs, dict[str, torch.Tensor] | None], Inputs]


@dataclass
class ParityReport:
    method: str  # "runtime" | "simulated" | "device" | "none"
    runtime: str | None
    simulator: str | None = None  # which interpreter / simulator ran it when method is "simulated"
    reason: str | None = None  # why method is "none"
    threshold_db: float | None = None
    min_snr_db: float | None = None  # the lowest gated figure: SNR, or the spectral figure of `spectral` outputs
    min_waveform_snr_db: float | None = None  # `spectral` outputs: their lowest SNR (recorded, not deciding)
    min_waveform_correlation: float | None = None  # `spectral` outputs: their lowest correlation with the reference (gated)
    min_token_agreement: float | None = None
    min_top1_agreement: float | None = None  # logits outputs: the lowest top-1 agreement (reported, judged by the tie rule)
    max_action_error: float | None = None  # `actions` outputs: the worst dimension's error, in units of its spread
    samples: dict = field(default_factory=dict)  # sample -> output -> scores
    divergences: list = field(default_factory=list)  # every token / top-1 flip, tie-break or not
    failures: list = field(default_factory=list)  # why the verdict is "fail", one line each
    nonfinite: list = field(default_factory=list)  # the failures that are NaN / inf (never waived)
    # Failures of the scheme and end-to-end figures that an explicit request for a scheme declared
    # too coarse for the component accepts (`measure_split(accepted=...)`): shown, not deciding.
    waived: list = field(default_factory=list)
    # Quantized artifacts (edgex.parity.scheme.measure_split): the scheme reference vs fp32 eager
    # and the artifact vs the scheme reference, each with its own gate; None for float schemes.
    scheme: dict | None = None
    lowering: dict | None = None
    # The check that decided the verdict (`deciding_gate`): {"figure", "check", "value", "limit",
    # "min_snr_db", "threshold_db"}.
    gate: dict | None = None
    # fp16 artifacts on a runtime that accumulates in fp16 (`edgex.parity.half_arithmetic`): the
    # component's floor there and the gates it set; None elsewhere.
    half_arithmetic: dict | None = None
    seconds: float = 0.0
    verdict: str = "unverified"  # "pass" | "fail" | "unverified"

    def to_json(self) -> dict:
        return strict_json(asdict(self))


END_TO_END = "end-to-end"  # the artifact vs fp32 eager: the figure a user of the artifact gets

# The checks a figure is judged by, in the order one decides a failure within a figure: a NaN / inf,
# the SNR (or spectral figure) against the gate, a flip beyond the tie margin (value: the worst
# flip's reference margin in tie margins), the action error, the waveform correlation, and nothing
# scored at all (no figure).
NONFINITE, SNR, TOKEN_FLIP, ACTION, CORRELATION, NOTHING = (
    "non-finite", "SNR", "token flip", "action error", "waveform correlation", "nothing scored")


def check(figure: str, name: str, value, limit, min_snr_db=None, threshold_db=None) -> dict:
    """One check of a figure as the manifest records a deciding gate: what was compared with what,
    its value and its limit, and the figure's SNR and gate beside them."""
    return {"figure": figure, "check": name, "value": value, "limit": limit, "min_snr_db": min_snr_db,
            "threshold_db": threshold_db}


def _db_margin(gate: dict) -> float:
    snr, limit = gate["min_snr_db"], gate["threshold_db"]
    if snr is None or limit is None or math.isnan(snr) or math.isnan(limit):
        return -math.inf
    return snr - limit


def deciding_gate(figures: dict[str, tuple[dict, bool]]) -> dict:
    """The check that decided a verdict, from `{figure: (its deciding check, failed)}` in report
    order. Of failed figures: a NaN / inf first, then an SNR under its gate by the least margin
    (the one furthest under), then any other failed check in report order (a token flip, an action
    error, a waveform correlation, a reference's own check). A pass names the figure whose SNR it
    passed closest to its gate."""
    failed = [(name, gate) for name, (gate, bad) in figures.items() if bad]
    if failed:
        def rank(item):
            gate = item[1]
            return (0, 0.0) if gate["check"] == NONFINITE else (1, _db_margin(gate)) if gate["check"] == SNR else (2, 0.0)

        name, gate = min(failed, key=rank)
    else:
        name, gate = min(((name, gate) for name, (gate, _) in figures.items()), key=lambda item: _db_margin(item[1]))
    return {**gate, "figure": name}


def entry_gate(parity: dict | None, tensors: dict | None = None, quantized: dict | None = None,
               device: dict | None = None) -> dict | None:
    """An entry's deciding check, from its blocks (the manifest's `parity`, `tensor_parity`,
    `quantized_parity`, `device_parity`): the parity run's when it failed; else the first of the
    stored-tensor checks and the device run that failed; else the parity run's (its thinnest margin)."""
    gate = (parity or {}).get("gate")
    if (parity or {}).get("verdict") == "fail":
        return gate
    if (tensors or {}).get("verdict") == "fail":
        return check("stored tensors", SNR, tensors.get("min_snr_db"), tensors.get("threshold_db"),
                     tensors.get("min_snr_db"), tensors.get("threshold_db"))
    if (quantized or {}).get("verdict") == "fail":
        return check("stored quantized tensors", "agreement", quantized.get("min_agreement_db"), quantized.get("threshold_db"),
                     quantized.get("min_agreement_db"), quantized.get("threshold_db"))
    if (device or {}).get("verdict") == "fail":
        return {**(device.get("gate") or check("device", SNR, device.get("min_snr_db"), device.get("threshold_db"),
                                                device.get("min_snr_db"), device.get("threshold_db"))), "figure": "device"}
    return gate


def to_numpy(inputs, float_dtype: str) -> list[np.ndarray]:
    arrays = []
    for tensor in inputs:
        array = tensor.detach().cpu().numpy()
        arrays.append(array.astype(float_dtype) if np.issubdtype(array.dtype, np.floating) else array)
    return arrays


def tie_margin(level_db: float, reference_logits: np.ndarray) -> float:
    """The largest score difference an error exactly at `level_db` can make at one position: noise
    of rms 10**(-level/20) * rms(logits), and a flip moves two scores. Flips are judged at
    `gates.tie_db(gate)`, never at a looser gate's level."""
    rms = math.sqrt(float(np.mean(np.asarray(reference_logits, np.float64) ** 2)))
    return 2.0 * 10.0 ** (-level_db / 20.0) * rms


def flips(scores: np.ndarray, logits: np.ndarray, chosen: np.ndarray, gate_db: float,
          level_db: float | None = None) -> list[dict]:
    """Positions (flat over all axes but the last) where `chosen` is not the argmax of the
    reference's `scores`, with the reference margin score[r] - score[a] and the tie margin from
    the reference `logits` there, at `tie_db(gate_db)`: a 5 dB policy gate judges flips as a 30 dB
    one does (`level_db`: another tie level, e.g. `gates.end_to_end_tie_db`). A choice outside the
    vocabulary has an infinite margin."""
    vocab = scores.shape[-1]
    scores = np.asarray(scores, np.float64).reshape(-1, vocab)
    logits = np.asarray(logits, np.float64).reshape(-1, vocab)
    chosen = np.asarray(chosen).reshape(-1).astype(np.int64)
    best = np.argmax(scores, axis=-1)
    level = tie_db(gate_db) if level_db is None else level_db
    found = []
    for p in np.nonzero(best != chosen)[0]:
        r, a = int(best[p]), int(chosen[p])
        margin = float(scores[p, r] - scores[p, a]) if 0 <= a < vocab else math.inf
        allowed = tie_margin(level, logits[p])
        found.append({"position": int(p), "reference": r, "artifact": a, "margin": margin, "tie_margin": allowed,
                      "tie_db": level, "tie": margin <= allowed})
    return found


@dataclass
class SampleScore:
    scores: dict  # output -> figures
    divergences: list  # flips, each with its output name
    failures: list  # one line per reason this sample fails
    nonfinite: list = field(default_factory=list)  # one line per output holding NaN / inf (also in failures)


def _nonfinite(name: str, ref: np.ndarray, out: np.ndarray) -> str | None:
    """Why `out` (or its reference) cannot pass whatever its figures say, or None."""
    bad_ref = metrics.nonfinite_count(ref)
    if bad_ref:
        return f"{name}: the reference holds {bad_ref} NaN / inf value(s) of {ref.size}"
    bad_out = metrics.nonfinite_count(out)
    if bad_out:
        return f"{name}: {bad_out} NaN / inf value(s) of {out.size} where the reference is finite"
    return None


def _figures(ref: np.ndarray, out: np.ndarray) -> dict:
    return {
        "snr_db": metrics.snr_db(ref, out),
        "psnr_db": metrics.psnr_db(ref, out),
        "cosine": metrics.cosine(ref, out),
        "max_abs_err": float(np.max(np.abs(ref.astype(np.float64) - out.astype(np.float64)))) if ref.size else 0.0,
    }


def _signal(component: Component, spec: TensorSpec, inputs: Inputs, ref: np.ndarray, out: np.ndarray) -> dict:
    written = component.written.get(spec.name)
    if spec.name in component.spectral:
        return _figures(ref, out) | {"spectral_db": metrics.spectral_db(ref, out)}
    if spec.name in component.actions:
        errors = metrics.action_error(ref, out, component.actions[spec.name])
        return _figures(ref, out) | {"action_error": float(np.max(errors)), "action_error_dims": [float(e) for e in errors]}
    if written is None:
        return _figures(ref, out)
    mask = np.zeros(ref.shape, bool)
    mask[written(inputs)] = True
    entry = _figures(ref[mask], out[mask]) | {"written_entries": int(mask.sum()), "entries": int(mask.size)}
    if not mask.all():
        entry["copied_snr_db"] = metrics.snr_db(ref[~mask], out[~mask])
    return entry


def _sampled(spec: TensorSpec, by_name: dict[str, np.ndarray], outputs: dict[str, np.ndarray]) -> bool:
    """A sampled TOKENS output whose ids are usable as forced inputs (right shape, in vocabulary)."""
    out, ref = outputs[spec.name], by_name[spec.name]
    vocab = by_name[spec.sampled_from[0]].shape[-1]
    return out.shape == ref.shape and np.issubdtype(out.dtype, np.integer) and bool(np.all((out >= 0) & (out < vocab)))


def gated_figures(scores: dict) -> list[float]:
    """The figures of one output that its gate judges: the spectral figure where it has one (its
    SNR is then recorded only), else its SNR; and the SNR of the copied entries of a state output."""
    first = "spectral_db" if "spectral_db" in scores else "snr_db"
    return [scores[k] for k in (first, "copied_snr_db") if k in scores]


def score_sample(component: Component, inputs: Inputs, outputs: list[np.ndarray], reference: Reference,
                 gate_db: float, tie_level_db: float | None = None) -> SampleScore:
    """Every output of one artifact run against `reference` on the same inputs."""
    if len(outputs) != len(component.outputs):
        raise ValueError(f"{component.name}: artifact returned {len(outputs)} outputs, spec has {len(component.outputs)}")
    outs = {spec.name: np.asarray(o) for spec, o in zip(component.outputs, outputs)}
    free = {spec.name: t.detach().cpu().numpy() for spec, t in zip(component.outputs, reference(inputs, None))}
    forced = {s.name: torch.from_numpy(outs[s.name].astype(np.int64)) for s in component.outputs
              if s.kind == TOKENS and s.sampled_from and _sampled(s, free, outs) and not np.array_equal(outs[s.name], free[s.name])}
    refs = free
    if forced:
        refs = {spec.name: t.detach().cpu().numpy() for spec, t in zip(component.outputs, reference(inputs, forced))}
    named_inputs = {spec.name: t.detach().cpu().numpy() for spec, t in zip(component.inputs, inputs)}
    result = SampleScore({}, [], [])
    for spec in component.outputs:
        ref, out = refs[spec.name], outs[spec.name]
        if out.shape != ref.shape:
            result.scores[spec.name] = {"error": f"shape {out.shape} != reference {ref.shape}", "snr_db": -math.inf}
            result.failures.append(f"{spec.name}: shape {out.shape} != reference {ref.shape}")
            continue
        why = _nonfinite(spec.name, ref, out)
        if why:
            result.nonfinite.append(why)
            result.failures.append(why)
        if spec.kind == TOKENS:
            found = _token_flips(spec, refs, named_inputs, out, gate_db, tie_level_db)
            result.scores[spec.name] = {"agreement": 1.0 - len(found) / max(ref.size, 1), "teacher_forced": spec.name in forced}
        else:
            result.scores[spec.name] = _signal(component, spec, inputs, ref, out)
            found = []
            if spec.kind == LOGITS:
                result.scores[spec.name]["top1_agreement"] = metrics.top1_agreement(ref, out)
                found = flips(ref, ref, np.argmax(out, axis=-1), gate_db, tie_level_db)
        for flip in found:
            result.divergences.append({"output": spec.name, "teacher_forced": bool(forced), **flip})
            if not flip["tie"]:
                result.failures.append(f"{spec.name} position {flip['position']}: artifact {flip['artifact']}, reference "
                                       f"{flip['reference']}, margin {flip['margin']:.4g} > tie margin {flip['tie_margin']:.4g}")
    return result


def _token_flips(spec: TensorSpec, refs: dict, inputs: dict, out: np.ndarray, gate_db: float,
                 tie_level_db: float | None = None) -> list[dict]:
    """Sampled tokens: choices that are not the reference's own argmax of its scores (logits +
    noise). Other tokens must be equal: any difference is a flip with no margin to allow it."""
    if spec.sampled_from is None:
        ref = refs[spec.name]
        return [{"position": int(p), "reference": int(r), "artifact": int(a), "margin": math.inf, "tie_margin": 0.0, "tie": False}
                for p, (r, a) in enumerate(zip(ref.reshape(-1), out.reshape(-1))) if r != a]
    logits_name, noise_name = spec.sampled_from
    logits = refs[logits_name]
    scores = logits.astype(np.float64) + (inputs[noise_name].astype(np.float64) if noise_name else 0.0)
    return flips(scores, logits, out, gate_db, tie_level_db)


def measure(
    component: Component,
    session: Session,
    runtime: str,
    float_dtype: str,
    threshold_db: float,
    method: str = "runtime",
    simulator: str | None = None,
    reference: Reference | None = None,
    tie_level_db: float | None = None,
) -> ParityReport:
    """Run `session` on every sample and gate it: min SNR >= threshold_db, no flip but tie-breaks,
    and something scored at all (no samples or no scored output is a fail, never a pass). Flips are
    judged at `tie_level_db`, by default `gates.tie_db(threshold_db)`."""
    start = time.perf_counter()
    reference = reference or component.eager
    report = ParityReport(method, runtime, simulator, threshold_db=threshold_db)
    snrs, waveform, correlations, agreements, top1, actions, failures, nonfinite = [], [], [], [], [], [], [], []
    not_run = {}
    for sample, inputs in component.samples.items():
        arrays = to_numpy(inputs, float_dtype)
        why = session.cannot_run(arrays)
        if why:
            report.samples[sample] = not_run[sample] = {"not_run": why}
            continue
        result = score_sample(component, inputs, session.run(arrays), reference, threshold_db, tie_level_db)
        report.samples[sample] = result.scores
        report.divergences += [{"sample": sample, **d} for d in result.divergences]
        failures += [f"{sample}: {f}" for f in result.failures if f not in result.nonfinite]
        nonfinite += [f"{sample}: {f}" for f in result.nonfinite]
        snrs += [f for s in result.scores.values() for f in gated_figures(s)]
        waveform += [s["snr_db"] for s in result.scores.values() if "spectral_db" in s]
        correlations += [s["cosine"] for s in result.scores.values() if "spectral_db" in s]
        agreements += [s["agreement"] for s in result.scores.values() if "agreement" in s]
        top1 += [s["top1_agreement"] for s in result.scores.values() if "top1_agreement" in s]
        actions += [s["action_error"] for s in result.scores.values() if "action_error" in s]
    report.min_snr_db = metrics.lowest(snrs)
    report.min_waveform_snr_db = metrics.lowest(waveform)
    report.min_waveform_correlation = metrics.lowest(correlations)
    report.min_token_agreement = min(agreements) if agreements else None
    report.min_top1_agreement = min(top1) if top1 else None
    report.max_action_error = max(actions) if actions else None
    nothing = not component.samples or (not snrs and not agreements)
    if not component.samples:
        failures.append(f"{component.name} has no samples: nothing was run")
    elif len(not_run) == len(component.samples):
        failures.append(f"{component.name}: this runtime runs none of its samples ({next(iter(not_run.values()))['not_run']})")
    elif not snrs and not agreements:
        failures.append(f"{component.name}: no output was scored")
    low_snr = report.min_snr_db is not None and not report.min_snr_db >= threshold_db
    if low_snr:
        figure = "min SNR / spectral figure" if component.spectral else "min SNR"
        failures.insert(0, f"{figure} {report.min_snr_db:.1f} dB below the {threshold_db:.1f} dB gate")
    low_action = bool(actions) and not report.max_action_error <= ACTION_ERROR
    if low_action:
        failures.append(f"action error {report.max_action_error:.3g} of a dimension's spread above the {ACTION_ERROR:g} gate")
    low_correlation = bool(correlations) and not report.min_waveform_correlation >= WAVEFORM_CORRELATION
    if low_correlation:
        failures.append(f"waveform correlation {report.min_waveform_correlation:.3f} with the reference below the "
                        f"{WAVEFORM_CORRELATION:g} floor (a sign flip or a shifted waveform)")
    report.nonfinite = nonfinite
    report.failures = nonfinite + failures  # a NaN / inf is the reason, the -inf figure its consequence
    report.verdict = "fail" if report.failures else "pass"
    bad_flips = [d for d in report.divergences if not d["tie"]]
    worst_flip = max((d["margin"] / d["tie_margin"] if d["tie_margin"] > 0 else math.inf for d in bad_flips), default=None)
    figures = (report.min_snr_db, threshold_db)
    checks = [(bool(nonfinite), check(END_TO_END, NONFINITE, len(nonfinite), 0, *figures)),
              (low_snr, check(END_TO_END, SNR, report.min_snr_db, threshold_db, *figures)),
              (bool(bad_flips), check(END_TO_END, TOKEN_FLIP, worst_flip, 1.0, *figures)),
              (low_action, check(END_TO_END, ACTION, report.max_action_error, ACTION_ERROR, *figures)),
              (low_correlation, check(END_TO_END, CORRELATION, report.min_waveform_correlation, WAVEFORM_CORRELATION, *figures)),
              (nothing, check(END_TO_END, NOTHING, None, None, *figures))]
    fallback = check(END_TO_END, "failed", None, None, *figures) if report.failures else checks[1][1]
    report.gate = next((gate for bad, gate in checks if bad), fallback)
    report.seconds = time.perf_counter() - start
    return report
