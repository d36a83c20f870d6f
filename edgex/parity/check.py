"""Run an artifact on every sample of its component and score it against the eager reference."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..component import LOGITS, TOKENS, Component
from ..artifacts.files import strict_json
from . import metrics
from .runtimes.base import Session


@dataclass
class ParityReport:
    method: str  # "runtime" | "simulated" | "none"
    runtime: str | None
    simulator: str | None = None  # which interpreter / simulator ran it when method is "simulated"
    reason: str | None = None  # why method is "none"
    threshold_db: float | None = None
    token_threshold: float | None = None
    min_snr_db: float | None = None
    min_token_agreement: float | None = None
    samples: dict = field(default_factory=dict)  # sample -> output -> scores
    seconds: float = 0.0
    verdict: str = "unverified"  # "pass" | "fail" | "unverified"

    def to_json(self) -> dict:
        return strict_json(asdict(self))


def to_numpy(inputs, float_dtype: str) -> list[np.ndarray]:
    arrays = []
    for tensor in inputs:
        array = tensor.detach().cpu().numpy()
        arrays.append(array.astype(float_dtype) if np.issubdtype(array.dtype, np.floating) else array)
    return arrays


def score_outputs(component: Component, sample: str, outputs: list[np.ndarray]) -> dict:
    """Per-output scores of one run against the reference on the same sample."""
    reference = component.reference_outputs(sample)
    if len(outputs) != len(component.outputs):
        raise ValueError(f"{component.name}: artifact returned {len(outputs)} outputs, spec has {len(component.outputs)}")
    scores = {}
    divergence = _first_divergence(component, reference, outputs)
    for spec, ref_t, out in zip(component.outputs, reference, outputs):
        ref = ref_t.detach().cpu().numpy()
        if tuple(np.shape(out)) != tuple(ref.shape):
            scores[spec.name] = {"error": f"shape {tuple(np.shape(out))} != reference {tuple(ref.shape)}", "snr_db": -math.inf}
            continue
        if spec.kind == TOKENS:
            scores[spec.name] = {"agreement": metrics.token_agreement(ref, out), "first_divergence": divergence.get(spec.name)}
            continue
        entry = {}
        step = divergence.get(spec.conditioned_on) if spec.conditioned_on else None
        if step is not None:
            if ref.ndim < 2 or ref.shape[1] == 1:
                scores[spec.name] = {"skipped": f"depends on all of {spec.conditioned_on}, which diverged at step {step}"}
                continue
            ref, out = ref[:, : step + 1], np.asarray(out)[:, : step + 1]
            entry["compared_steps"] = step + 1
        entry |= {
            "snr_db": metrics.snr_db(ref, out),
            "psnr_db": metrics.psnr_db(ref, out),
            "cosine": metrics.cosine(ref, out),
            "max_abs_err": float(np.max(np.abs(ref.astype(np.float64) - np.asarray(out, np.float64)))),
        }
        if spec.kind == LOGITS:
            entry["top1_agreement"] = metrics.top1_agreement(ref, out)
        scores[spec.name] = entry
    return scores


def _first_divergence(component: Component, reference, outputs) -> dict[str, int | None]:
    """Per TOKENS output: the first step (axis 1) where artifact and reference tokens differ."""
    found = {}
    for spec, ref_t, out in zip(component.outputs, reference, outputs):
        if spec.kind == TOKENS and tuple(np.shape(out)) == tuple(ref_t.shape):
            ref = ref_t.detach().cpu().numpy()
            diff = np.nonzero((ref != np.asarray(out)).reshape(ref.shape[0], -1).any(axis=0))[0] if ref.ndim > 1 else []
            found[spec.name] = int(diff[0]) if len(diff) else None
    return found


def measure(
    component: Component,
    session: Session,
    runtime: str,
    float_dtype: str,
    threshold_db: float,
    token_threshold: float | None,
    method: str = "runtime",
    simulator: str | None = None,
) -> ParityReport:
    start = time.perf_counter()
    report = ParityReport(method, runtime, simulator, threshold_db=threshold_db, token_threshold=token_threshold)
    snrs, agreements = [], []
    for sample, inputs in component.samples.items():
        outputs = session.run(to_numpy(inputs, float_dtype))
        scores = score_outputs(component, sample, outputs)
        report.samples[sample] = scores
        snrs += [s["snr_db"] for s in scores.values() if "snr_db" in s]
        agreements += [s["agreement"] for s in scores.values() if "agreement" in s]
    report.min_snr_db = min(snrs) if snrs else None
    report.min_token_agreement = min(agreements) if agreements else None
    passed = report.min_snr_db is None or report.min_snr_db >= threshold_db
    if token_threshold is not None and report.min_token_agreement is not None:
        passed = passed and report.min_token_agreement >= token_threshold
    report.verdict = "pass" if passed else "fail"
    report.seconds = time.perf_counter() - start
    return report
