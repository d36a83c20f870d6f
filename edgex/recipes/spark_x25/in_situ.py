"""In-situ parity for Spark-X2.5: the exported prefill and decode graphs driven by the host runner
(`runner.CacheRunner`: whole prefill chunks, then one token a step, ring and full-layer cache fed
back) against the eager model generating with the same Gumbel noise.

- teacher-forced: the prompt, then the eager model's own sampled tokens fed one by one; every
  position's logits against the eager model's, per graph (prefill positions, decode positions);
- free-running: the artifacts sample from their own logits with the same noise; token agreement,
  first divergence with the eager margin there (a near-tie at the in-situ tie level passes), and the
  logits over the agreed steps against the eager model's, held to the decode stage's gate."""

from __future__ import annotations

import time

import numpy as np
import torch

from ...errors import EdgexError
from ...parity.check import tie_margin
from ...parity.metrics import median, snr_db
from .graphs import empty_state
from .model import SparkCache
from .runner import CacheRunner

COMPONENTS = ("prefill", "decode")
SEED_OFFSET = 500  # neither a parity sample's prompt nor a calibration prompt
PROMPT_EXTRA = 3  # prompt tokens after the whole prefill chunks: the runner decodes them one by one
DEFAULT_STEPS = 48


def default_steps(chunk: int, context: int) -> int:
    """Decode steps of a default in-situ run (its prompt: two prefill chunks and PROMPT_EXTRA tokens)."""
    return min(DEFAULT_STEPS, context - (2 * chunk + PROMPT_EXTRA))


def last_decode_position(chunk: int, context: int) -> int | None:
    """Position of a default in-situ run's last decode call (the decode graph samples it too); None
    where the context holds no run."""
    steps = default_steps(chunk, context)
    return 2 * chunk + PROMPT_EXTRA + steps - 2 if steps > 0 else None


def in_situ(loaded, stages: dict, settings: dict, progress) -> dict:
    model, options = loaded.models, loaded.options
    chunk, context = options["prefill"], options["max_context"]
    prompt_len = 2 * chunk + PROMPT_EXTRA
    steps = settings.get("frames") or default_steps(chunk, context)
    if not 0 < steps <= context - prompt_len:
        raise EdgexError(f"--frames (decode steps) must be 1..{context - prompt_len} (context {context}, prompt {prompt_len})")
    gen = torch.Generator().manual_seed(1000 * options["seed"] + SEED_OFFSET)
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=gen)
    noise = -torch.log(-torch.log(torch.rand(steps, model.config.vocab_size, generator=gen).clamp(1e-9, 1 - 1e-9))).numpy()
    gates = {n: s.gate_db for n, s in stages.items()}

    progress("eager generation")
    model(prompt[:, :chunk], SparkCache.empty(model.config))  # warm-up: first-call allocations are not a step's cost
    cache, eager_logits, tokens, eager_ms = SparkCache.empty(model.config), [], [], {"prefill": [], "decode": []}
    for start in range(0, prompt_len, chunk):  # the eager model fed like the runner feeds the graphs
        piece = prompt[:, start : start + chunk] if prompt_len - start >= chunk else None
        began = time.perf_counter()
        if piece is not None:
            eager_logits.append(model(piece, cache)[0].numpy())
            eager_ms["prefill"].append((time.perf_counter() - began) * 1000)
        else:
            eager_logits += [model(prompt[:, p : p + 1], cache)[0].numpy() for p in range(start, prompt_len)]
    prompt_logits = np.concatenate(eager_logits)
    step_logits = [prompt_logits[-1]]
    for i in range(steps):
        tokens.append(int(np.argmax(step_logits[-1] + noise[i])))
        if i < steps - 1:
            began = time.perf_counter()
            step_logits.append(model(torch.tensor([[tokens[-1]]]), cache)[0, -1].numpy())
            eager_ms["decode"].append((time.perf_counter() - began) * 1000)

    def runner() -> CacheRunner:
        state = [t.numpy() for t in empty_state(model.config, context)]
        return CacheRunner(stages["prefill"], stages["decode"], state, chunk)

    progress("teacher-forced pass")
    forced = runner()
    got_prompt = forced.feed(prompt[0].numpy())
    got_steps = [got_prompt[-1]] + [forced.feed(np.array([t]))[-1] for t in tokens[:-1]]
    prefilled = 2 * chunk
    per_position = [snr_db(prompt_logits[p], got_prompt[p]) for p in range(prompt_len)]
    decode_db = per_position[prefilled:] + [snr_db(w, g) for w, g in zip(step_logits[1:], got_steps[1:])]
    tf = {"prefill": {"positions": prefilled, "logits_db": snr_db(prompt_logits[:prefilled], got_prompt[:prefilled]),
                      "logits_db_min_position": min(per_position[:prefilled])},
          "decode": {"positions": len(decode_db), "logits_db_min_position": min(decode_db), "logits_db_median": median(decode_db)}}
    failures = [f"teacher-forced {stage}: {tf[stage]['logits_db_min_position']:.1f} dB below its {gates[stage]:.1f} dB gate"
                for stage in COMPONENTS if not tf[stage]["logits_db_min_position"] >= gates[stage]]

    progress("free-running pass")
    for s in stages.values():
        s.times_ms.clear()
    free = runner()
    logits = free.feed(prompt[0].numpy())[-1]
    own, own_logits = [], []
    for i in range(steps):
        own_logits.append(logits)
        own.append(int(np.argmax(logits + noise[i])))
        if i < steps - 1:
            logits = free.feed(np.array(own[-1:]))[-1]
    differ = [i for i, (a, b) in enumerate(zip(tokens, own)) if a != b]
    divergence = None
    if differ:
        i = differ[0]
        scores = step_logits[i].astype(np.float64) + noise[i]
        margin = float(scores[tokens[i]] - scores[own[i]])
        allowed = tie_margin(stages["decode"].tie_db, step_logits[i])
        divergence = {"step": i, "reference": tokens[i], "artifact": own[i], "margin": margin, "tie_margin": allowed,
                      "tie_db": stages["decode"].tie_db, "tie": margin <= allowed}
        if margin > allowed:
            failures.append(f"free-running: step {i} sampled {own[i]} where the eager model sampled {tokens[i]}, "
                            f"margin {margin:.4g} > tie margin {allowed:.4g}")
    agreed = differ[0] if differ else steps
    fr = {"steps": steps, "token_agreement": float(np.mean(np.array(tokens) == np.array(own))), "first_divergence": divergence,
          "agreed_steps": agreed,
          "logits_db_agreed_steps": snr_db(np.stack(step_logits[: agreed]), np.stack(own_logits[: agreed])) if agreed else None}
    # the logits the artifacts sampled from, over the steps whose history is the eager one, held to the decode gate
    if agreed and not fr["logits_db_agreed_steps"] >= gates["decode"]:
        failures.append(f"free-running logits over the {agreed} agreed steps: {fr['logits_db_agreed_steps']:.1f} dB below "
                        f"the decode's {gates['decode']:.1f} dB gate")
    ms = {n: median(stages[n].times_ms) for n in COMPONENTS}
    eager = {n: median(v) for n, v in eager_ms.items()}
    timing = {"artifact_ms": ms, "eager_ms": eager, "eager_over_artifact": {n: round(eager[n] / ms[n], 2) for n in ms if ms[n] and eager[n]},
              "artifact_time_to_first_token_ms": round(2 * ms["prefill"] + PROMPT_EXTRA * ms["decode"], 1),
              "eager_time_to_first_token_ms": round(2 * eager["prefill"] + PROMPT_EXTRA * eager["decode"], 1),
              "artifact_tokens_per_s": round(1000 / ms["decode"], 1), "eager_tokens_per_s": round(1000 / eager["decode"], 1)}
    return {"prompt_tokens": prompt_len, "steps": steps, "teacher_forced": tf, "free_running": fr, "timing": timing,
            "failures": failures}
