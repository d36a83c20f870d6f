"""The sweep's recommendation: per component the best passing point by an objective, and the whole
placement checked in situ (`edgex pipeline`) before it is recommended.

- **Objective**, per component: `latency_ms` where this machine measured every passing point of it
  (the artifact's own runtime, not a simulator), else `bytes`; ties go to the higher dB.
- **Floor**: every recommended point passed its own gate (dB against fp32 eager, the scheme and
  lowering gates for quantized and fp16 points); no failed or unverified point is ever a candidate.
  Nor is a point at a scheme its recipe declares too coarse for the component (verdict "pass
  (coarse)": its lowering passed, its scheme is ruled out by the model's own facts), unless the
  sweep is asked to admit them (`allow_coarse`, `--allow-coarse`); the recommendation lists the
  points it left out and why (`left_out`).
- **In situ**: the points that serve the model's pipeline stages (`Recipe.in_situ_components`) are
  tried as whole placements in objective order (best-first by the sum of each stage's rank: first
  every stage's best, then one stage at its second best, ...), each run through the pipeline, up to
  `bound` placements. The first that passes is recommended; if none of the first `bound` does, the
  recommendation says so and names none (the sweep exits 1). Components that serve no stage keep
  their objective's best; a model with no pipeline, a sweep that lacks a stage, or `bound` 0 leave
  the in-situ verdict "not run", with the reason.
"""

from __future__ import annotations

import itertools
import math
from typing import Callable

from ..errors import EdgexError
from ..recipes.base import stage_options
from ..status import COARSE_PASS, PASS, passed

DEFAULT_BOUND = 3


def _number(value) -> float:
    """Figures as strict JSON stores them ("inf") back to floats; None sorts last."""
    return -math.inf if value is None else float(value)


def candidate(row: dict, allow_coarse: bool = False) -> bool:
    """Whether a row may be recommended: it passed, and at a scheme not declared too coarse for its
    component unless `allow_coarse`."""
    return row["verdict"] == PASS or (allow_coarse and row["verdict"] == COARSE_PASS)


def objective(rows: list[dict], allow_coarse: bool = False) -> str:
    """`latency_ms` when every candidate row has one measured here, else `bytes`."""
    passing = [r for r in rows if candidate(r, allow_coarse)]
    return "latency_ms" if passing and all(r.get("latency_ms") is not None for r in passing) else "bytes"


def ranked(rows: list[dict], by: str, allow_coarse: bool = False) -> list[dict]:
    """The candidate rows, best first by `by`, ties to the higher dB."""
    return sorted((r for r in rows if candidate(r, allow_coarse)), key=lambda r: (r[by], -_number(r["min_snr_db"])))


def left_out(rows: list[dict], placement_line: Callable[[dict], str], allow_coarse: bool = False) -> list[dict]:
    """The passing points no recommendation may name, each with why: those at a coarse scheme."""
    if allow_coarse:
        return []
    return [{"point": placement_line(r), "reason": f"{COARSE_PASS}: {r.get('coarse_scheme') or 'declared too coarse'}"}
            for r in rows if r["verdict"] == COARSE_PASS]


def placements(stages: list[list[dict]], bound: int) -> list[tuple[dict, ...]]:
    """The first `bound` whole placements (one row per stage), best-first by the sum of the ranks
    (then by the ranks themselves). A rank at or past `bound` cannot be among the first `bound`."""
    capped = [range(min(len(rows), bound)) for rows in stages]
    order = sorted(itertools.product(*capped), key=lambda ranks: (sum(ranks), ranks))
    return [tuple(rows[i] for rows, i in zip(stages, ranks)) for ranks in order[:bound]]


def swept_stages(pipeline_stages, swept: set[str]) -> list[tuple[str, ...]]:
    """Each pipeline stage as the components whose points may serve it, one point a stage. A stage
    with an alternative of several components serving it together (Qwen3-TTS's decoder: the
    streaming pair, or Code2Wav's windowed graph) is the first alternative the sweep holds whole (else
    its first), a group as one stage per component."""
    out = []
    for stage in pipeline_stages:
        options = stage_options(stage)
        if all(len(o) == 1 for o in options):
            out.append(tuple(o[0] for o in options))
            continue
        group = next((o for o in options if swept.issuperset(o)), options[0])
        out += [(name,) for name in group]
    return out


def recommend(rows: list[dict], pipeline_stages, placement_line: Callable[[dict], str],
              run: Callable[[list[str]], dict] | None, bound: int = DEFAULT_BOUND, allow_coarse: bool = False) -> dict:
    """`{"objective", "chosen", "in_situ", "left_out", "allow_coarse", "served_by"}`: per component its
    objective and chosen row (None: none passed, or no placement passed in situ, or its stage is served
    by an alternative component, named in `served_by`), the in-situ verdict with
    every placement tried, and the passing points left out of the choice with why (`left_out`).
    `run(placement lines)` runs the pipeline and returns its report (`edgex.in_situ.run_pipeline`);
    None or `pipeline_stages` empty: not run."""
    components = list(dict.fromkeys(r["component"] for r in rows))
    by = {c: objective([r for r in rows if r["component"] == c], allow_coarse) for c in components}
    chosen = {c: next(iter(ranked([r for r in rows if r["component"] == c], by[c], allow_coarse)), None) for c in components}
    swept = set(components)
    stages = swept_stages(pipeline_stages, swept)
    result = {"objective": by, "chosen": chosen, "in_situ": {"bound": bound, "tried": []},
              "left_out": left_out(rows, placement_line, allow_coarse), "allow_coarse": allow_coarse}
    situ = result["in_situ"]
    if run is None or not stages:
        situ.update(verdict="not run", reason="the model has no in-situ pipeline" if not stages else "--in-situ 0")
        return result
    missing = [" or ".join(s) for s in stages if not swept.intersection(s)]
    if missing:
        situ.update(verdict="not run", reason=f"the sweep has no point of the pipeline stage(s) {', '.join(missing)}")
        return result
    candidates = []
    for stage in stages:  # a stage with alternative components: their passing points in one ranking
        mine = [r for r in rows if r["component"] in stage]
        candidates.append(ranked(mine, objective(mine, allow_coarse), allow_coarse))
    if any(not c for c in candidates) or bound < 1:
        situ.update(verdict="not run", reason="a pipeline stage has no passing point" if bound >= 1 else "bound 0")
        return result
    for placement in placements(candidates, bound):
        lines = [placement_line(r) for r in placement]
        try:
            report = run(lines)
        except EdgexError as exc:
            situ["tried"].append({"placement": lines, "verdict": "error", "failures": [str(exc)]})
            continue
        situ["tried"].append({"placement": lines, "verdict": report["verdict"], "failures": report["failures"][:3]})
        if passed(report["verdict"]):
            for row in placement:
                served = [s for s in stages if row["component"] in s][0]
                for component in served:  # the stage's other alternative is not what the placement deploys
                    if component in chosen and component != row["component"]:
                        chosen[component] = None
                        result.setdefault("served_by", {})[component] = row["component"]
                chosen[row["component"]] = row
            situ.update(verdict=report["verdict"], placement=lines)
            return result
    for stage in stages:
        for component in stage:
            if component in chosen:
                chosen[component] = None
    situ.update(verdict="fail", reason=f"none of the first {len(situ['tried'])} placement(s) in objective order passed in situ")
    return result
