"""The Qwen3-TTS frame benchmark: one talker step + the 15-codebook predictor frame, on
the CPU, every engine in one process and one run at a fixed thread count.

    .venv/bin/python benchmarks/bench_cpu.py --frame --preset 0.6b --threads 2 --out out-bench-frame

Engines: the eager fp32 model (the official modules: the talker's KV-cached step and the code
predictor's own loop), edgex's ONNX artifacts of `talker_decode` and `code_predictor` (one graph per
frame, KV-cached, greedy sampling inside the graph) in every `--onnx` precision, and edgex's talker
GGUF in llama.cpp in every `--gguf` precision, with llama.cpp's own predictor where the precision is
one its mmproj is built at (f32 / f16 / q8_0): libmtmd's whole-frame graph from edgex's mmproj GGUF,
greedy (`top_k = 1`), timed without the logits read-back parity uses. The last
row, "best frame", is the fastest talker step and the fastest predictor frame of the rows above
among those that pass their gate with greedy codes equal to eager's or differing only by ties.

Frames come from an eager utterance (greedy, seeded) at talker positions `--context` ..
`--context + --frames - 1`, teacher-forced: every engine gets the eager history (the talker's KV cache
and input embeds; the predictor's talker hidden state and code 0), so each frame's greedy codes are
compared with eager's on the same inputs. A differing code passes only as a tie of the eager scores
(`edgex.parity.check.flips` at the artifact's gate); the margins are printed. Each artifact also gets
its gate figures from `edgex.export.run_parity` (min SNR vs fp32 eager, scheme and lowering).

Memory bandwidth is measured in the same run (a 2-thread reduction over 1 GiB). Bytes read per frame
are counted from what each engine reads: the ONNX graph's constant inputs per node (a Gather reads
rows, not its table) plus its tensor inputs (the talker's static K/V cache), the GGUF's tensors but
`token_embd` (the talker is fed embeddings) plus llama.cpp's F16 cache up to the position, and the
eager modules' parameters plus the cache up to the position. floor ms = bytes / bandwidth.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from edgex.artifacts.files import staging_dir
from edgex.host import cpu_features, cpu_model
from edgex.export import run_parity
from edgex.exporters import EXPORTERS
from edgex.exporters.onnx import NBITS, quantize_matmuls
from edgex.parity.check import flips
from edgex.parity.gates import threshold_db
from edgex.parity.runtimes import RUNTIMES
from edgex.recipes import RECIPES
from edgex.recipes.qwen3_tts.pipeline import AUDIO_CODES, Utterance, padded_cache
from edgex.recipes.qwen3_tts.predictor import frame_reference
from edgex.recipes.qwen3_tts.talker import decode_reference
from edgex.resources import PeakRss


def bandwidth_gbps(threads: int, gib: int = 1, runs: int = 7) -> float:
    """Read bandwidth: the median time of a `threads`-thread sum over `gib` GiB of float32."""
    torch.set_num_threads(threads)
    x = torch.ones(gib * 2**28)
    times = []
    for _ in range(runs + 1):
        start = time.perf_counter()
        float(x.sum())
        times.append(time.perf_counter() - start)
    return x.numel() * 4 / statistics.median(times[1:]) / 1e9


class Frames:
    """`count` eager frames from talker position `context` on, greedy, with their inputs per engine."""

    def __init__(self, talker, prefill_len: int, slots: int, context: int, count: int, seed: int):
        self.talker = talker
        first = context - prefill_len
        utt = Utterance(talker, prefill_len, first + count + 1, seed, temperature=0.0)
        records = [utt.frame(f) for f in range(first, first + count + 1)]
        key, value = utt.cache(records[-1]["position"])
        # one static cache for every frame: a step ignores the slots at and after its position
        self.key, self.value = padded_cache(key, slots), padded_cache(value, slots)
        self.steps = [(r["next_embeds"], torch.tensor([r["position"]])) for r in records[:-1]]
        self.positions = [r["position"] for r in records[:-1]]

    def talker_inputs(self, i: int) -> tuple:
        return (*self.steps[i], self.key, self.value)


def greedy_code0(logits) -> int:
    return int(np.argmax(np.asarray(logits)[..., :AUDIO_CODES]))


def run_eager(frames: Frames, zeros) -> dict:
    """The official modules, per frame: talker step, greedy code 0, predictor loop."""
    talker, times, out = frames.talker, {"talker": [], "predictor": []}, []
    with torch.no_grad():
        for i in range(len(frames.steps)):
            start = time.perf_counter()
            logits, hidden, _, _ = decode_reference(talker, *frames.talker_inputs(i))
            mid = time.perf_counter()
            code0 = torch.tensor([[greedy_code0(logits)]])
            codes, _, _ = frame_reference(talker, hidden, code0, zeros)
            end = time.perf_counter()
            times["talker"].append(mid - start)
            times["predictor"].append(end - mid)
            out.append(dict(talker_logits=logits.numpy(), hidden=hidden, code0=code0, codes=codes.numpy()))
    return dict(times=times, frames=out)


def onnx_bytes(path: Path, input_bytes: int) -> int:
    """Bytes an ONNX graph reads per call: each node's constant inputs (a Gather reads one row per
    index: counted as 0 here), plus the graph's tensor inputs. A Transpose of an initializer is
    folded by ONNX Runtime when the session loads, so its readers are charged the weight's bytes
    (the fp32 predictor frame reads each layer's weights through one such Transpose, 15 times)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    sizes = {}
    for init in model.graph.initializer:
        location = next((e.value for e in init.external_data if e.key == "length"), None)
        sizes[init.name] = int(location) if location is not None else len(init.raw_data) or 4 * int(np.prod(init.dims))
    folded = {n.output[0]: sizes[n.input[0]] for n in model.graph.node if n.op_type == "Transpose" and n.input[0] in sizes}
    total = input_bytes
    for node in model.graph.node:
        if node.output[0] in folded:
            continue
        reads = node.input[1:] if node.op_type == "Gather" else node.input
        total += sum(sizes.get(name, folded.get(name, 0)) for name in reads)
    return total


def cache_bytes(talker, position: int, item: int) -> int:
    cfg = talker.config
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * position * item


def eager_bytes(talker, position: int) -> tuple[int, int]:
    """fp32 parameters the official modules read per talker step and per predictor frame."""
    size = lambda module: sum(p.numel() * p.element_size() for p in module.parameters())  # noqa: E731
    step = size(talker.model.layers) + size(talker.model.norm) + size(talker.codec_head) + cache_bytes(talker, position, 4)
    pred = talker.code_predictor
    per_pass = size(pred.model.layers) + size(pred.model.norm) + size(pred.small_to_mtp_projection)
    return step, 15 * per_pass + size(pred.lm_head)


class MtmdFrame:
    """libmtmd's predictor frame as a timed session: (hidden, code0, zero noise) -> [codes [1, 15]]."""

    phases: dict = {}

    def __init__(self, path: Path, threads: int):
        from edgex.parity.runtimes.mtmd import MtmdGen

        self.gen = MtmdGen(path, threads, read_logits=False)

    def run(self, inputs):
        codes, _, _ = self.gen.gen_code(inputs[0], int(np.asarray(inputs[1]).reshape(-1)[0]))
        return [codes[None, 1:]]


def mmproj_predictor_bytes(path: Path) -> int:
    """What a predictor frame reads of the mmproj: the predictor's tensors (a gather reads rows of
    its tables, counted whole as for the other engines' tables)."""
    from gguf import GGUFReader

    return sum(int(t.n_bytes) for t in GGUFReader(str(path)).tensors if t.name.startswith("a.gen.code."))


def gguf_bytes(path: Path, talker, position: int) -> int:
    from gguf import GGUFReader

    tensors = GGUFReader(str(path)).tensors
    return sum(int(t.n_bytes) for t in tensors if t.name != "token_embd.weight") + cache_bytes(talker, position, 2)


def time_calls(session, inputs: list, runs_phase: str | None = None) -> tuple[list, list[float]]:
    """Outputs and seconds of one call per input (after a warm-up on the first); with `runs_phase`,
    the time of that runtime phase (llama.cpp's `llama_decode`) instead of the whole call."""
    session.run(inputs[0])
    outputs, seconds = [], []
    for arrays in inputs:
        start = time.perf_counter()
        outputs.append(session.run(arrays))
        seconds.append(time.perf_counter() - start if runs_phase is None else session.phases[runs_phase] / 1e3)
    return outputs, seconds


def talker_agreement(eager: dict, outputs: list, gate: float) -> dict:
    ties, agree = [], 0
    for ref, out in zip(eager["frames"], outputs):
        logits = ref["talker_logits"][..., :AUDIO_CODES]
        code0 = greedy_code0(out[0])
        agree += code0 == int(ref["code0"])
        ties += flips(logits, logits, np.array([code0]), gate)
    return dict(agree=agree, total=len(outputs), flips=ties)


def predictor_agreement(talker, eager: dict, outputs: list, zeros, gate: float) -> dict:
    ties, agree, total = [], 0, 0
    for ref, out in zip(eager["frames"], outputs):
        codes = np.asarray(out[0])
        agree += int((codes == ref["codes"]).sum())
        total += codes.size
        if (codes != ref["codes"]).any():  # the eager scores on the artifact's own history
            _, logits, _ = frame_reference(talker, ref["hidden"], ref["code0"], zeros, forced_codes=torch.from_numpy(codes))
            ties += flips(logits.numpy(), logits.numpy(), codes, gate)
    return dict(agree=agree, total=total, flips=ties)


def summary_of(flipped: list) -> str:
    if not flipped:
        return "-"
    worst = max(flipped, key=lambda f: f["margin"] / max(f["tie_margin"], 1e-30))
    ok = all(f["tie"] for f in flipped)
    return f"{len(flipped)} flip(s), {'all ties' if ok else 'NOT ties'}; worst margin {worst['margin']:.4f} vs tie {worst['tie_margin']:.4f}"


def part(engine: str, codes: str, seconds: list[float], nbytes: int, agreement: dict, report, gate: str) -> dict:
    """One component's figures on one engine; `ok`: its gate passed (`report`, run_parity's) and
    every differing greedy code is a tie of eager's scores."""
    return dict(engine=engine, ms=1e3 * statistics.median(seconds), bytes=nbytes,
                parity=f"{codes} {agreement['agree']}/{agreement['total']}; {summary_of(agreement['flips'])}",
                ok=report.verdict == "pass" and all(f["tie"] for f in agreement["flips"]), gate=gate)


def frame_row(engine: str, parts: dict, export: str) -> dict:
    """A table row from a talker part and, where the engine runs it, a predictor part."""
    talker, predictor = parts["talker"], parts.get("predictor")
    return dict(engine=engine, talker_ms=talker["ms"], predictor_ms=predictor and predictor["ms"],
                frame_ms=predictor and talker["ms"] + predictor["ms"], bytes=talker["bytes"] + (predictor["bytes"] if predictor else 0),
                talker_parity=talker["parity"], predictor_parity=predictor["parity"] if predictor else "not placed in llama.cpp",
                gate="; ".join(p["gate"] for p in parts.values()), export=export, parts=parts)


def best_frame(rows: list[dict]) -> dict | None:
    """The fastest talker step and the fastest predictor frame of this run among the artifacts whose
    gate passed and whose greedy codes equal eager's or differ only by ties, as one frame (the two
    graphs run one after the other, so the frame is the sum of their medians)."""
    talkers = [r["parts"]["talker"] for r in rows if r["parts"]["talker"]["ok"]]
    predictors = [r["parts"]["predictor"] for r in rows if "predictor" in r["parts"] and r["parts"]["predictor"]["ok"]]
    if not talkers or not predictors:
        return None
    talker, predictor = min(talkers, key=lambda p: p["ms"]), min(predictors, key=lambda p: p["ms"])
    return frame_row(f"best frame: {talker['engine']} talker + {predictor['engine']} predictor",
                     dict(talker=talker, predictor=predictor), "(the rows above)")


def main(args) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    torch.set_num_threads(args.threads)
    recipe = RECIPES.get("qwen3-tts")
    start = time.perf_counter()
    loaded = recipe.load(args.preset, None, args.seed, {})
    talker = loaded.models.talker
    talker_c, predictor_c = recipe.components(loaded, ["talker_decode", "code_predictor"])
    frames = Frames(talker, loaded.options["prefill_len"], loaded.options["max_context"], args.context, args.frames,
                    args.seed + 7)
    zeros = torch.zeros(1, 15, AUDIO_CODES)
    console.log(f"built {args.preset}, components and {args.frames} eager frames in {time.perf_counter() - start:.0f} s")
    bandwidth = bandwidth_gbps(args.threads)
    console.log(f"read bandwidth {bandwidth:.1f} GB/s ({args.threads} threads)")
    cpu = f"{cpu_model()}; {' '.join(cpu_features())}"
    eager = run_eager(frames, zeros)
    step_b, pred_b = eager_bytes(talker, int(np.median(frames.positions)))
    rows = [dict(engine="eager fp32 (official modules)", talker_ms=1e3 * statistics.median(eager["times"]["talker"]),
                 predictor_ms=1e3 * statistics.median(eager["times"]["predictor"]), bytes=step_b + pred_b,
                 talker_parity="reference", predictor_parity="reference", gate="-", export="-")]
    rows[0]["frame_ms"] = rows[0]["talker_ms"] + rows[0]["predictor_ms"]
    console.print(json.dumps(rows[-1]), soft_wrap=True)
    talker_inputs = [[np.asarray(t.numpy()) for t in frames.talker_inputs(i)] for i in range(len(frames.steps))]
    pred_inputs = [[f["hidden"].numpy(), f["code0"].numpy(), zeros.numpy()] for f in eager["frames"]]
    args.out.mkdir(parents=True, exist_ok=True)
    onnx = EXPORTERS.get("onnx")
    ort = RUNTIMES.get(onnx.runtime)
    with staging_dir(args.out) as stage:
        fp32, fp32_cost = {}, {}
        for comp in (talker_c, predictor_c):  # fp32 once; the quantized precisions rewrite it, as the exporter does
            with PeakRss() as peak:
                t0 = time.perf_counter()
                fp32[comp.name] = onnx.export(comp, "fp32", stage / f"{comp.name}.fp32.onnx").files
            fp32_cost[comp.name] = f"{comp.name} {time.perf_counter() - t0:.0f} s / {peak.mb:.0f} MB"
            console.log(f"onnx fp32 export: {fp32_cost[comp.name]}")
            gc.collect()
        for precision in args.onnx.split(","):
            files, costs, reports = {}, [], []
            for comp in (talker_c, predictor_c):
                t0 = time.perf_counter()
                if precision == "fp32":
                    files[comp.name] = fp32[comp.name]
                    costs.append(fp32_cost[comp.name])
                else:
                    dest = stage / f"{comp.name}.{precision}.onnx"
                    with PeakRss() as peak:
                        quantize_matmuls(fp32[comp.name][0], dest, comp, NBITS[precision])
                    files[comp.name] = [dest, dest.with_name(dest.name + ".data")]
                    costs.append(f"{comp.name} {time.perf_counter() - t0:.0f} s / {peak.mb:.0f} MB")
                report = run_parity(comp, onnx, files[comp.name], "float32", precision, None, args.threads)
                split = f" (scheme {report.scheme['min_snr_db']:.1f} / lowering {report.lowering['min_snr_db']:.1f})" if report.scheme else ""
                reports.append((report, f"{comp.name} {report.verdict} {report.min_snr_db:.1f} dB{split}"))
                gc.collect()
            talker_s = ort.load(files[talker_c.name], args.threads)
            t_out, t_sec = time_calls(talker_s, talker_inputs)
            del talker_s
            pred_s = ort.load(files[predictor_c.name], args.threads)
            p_out, p_sec = time_calls(pred_s, pred_inputs)
            del pred_s
            gc.collect()
            gate = threshold_db("talker", precision)
            tp = talker_agreement(eager, t_out, gate)
            pp = predictor_agreement(talker, eager, p_out, zeros, threshold_db("predictor", precision))
            input_b = sum(a.nbytes for a in talker_inputs[0])
            parts = dict(talker=part(f"ONNX {precision}", "code0", t_sec, onnx_bytes(files[talker_c.name][0], input_b), tp,
                                     *reports[0]),
                         predictor=part(f"ONNX {precision}", "codes", p_sec, onnx_bytes(files[predictor_c.name][0], 0), pp,
                                        *reports[1]))
            row = frame_row(f"edgex ONNX {precision} (talker_decode + code_predictor)", parts, "; ".join(costs) or "-")
            rows.append(row)
            console.print(json.dumps(row, default=str), soft_wrap=True)
        gguf = EXPORTERS.get("gguf")
        llama = RUNTIMES.get(gguf.runtime)
        layout = talker_c.layouts["gguf"]  # fold the 151936 text rows through text_projection once, not per precision
        talker_c.layouts = {**talker_c.layouts, "gguf": dataclasses.replace(layout, tensors=functools.cache(layout.tensors))}
        for precision in [p for p in args.gguf.split(",") if p]:
            dest = stage / f"talker_decode.{precision}.gguf"
            t0 = time.perf_counter()
            with PeakRss() as peak:
                files = gguf.export(talker_c, precision, dest).files
            cost = f"talker_decode {time.perf_counter() - t0:.0f} s / {peak.mb:.0f} MB"
            report = run_parity(talker_c, gguf, files, "float32", precision, None, args.threads)
            session = llama.load(files, args.threads)
            t_out, t_sec = time_calls(session, talker_inputs, "llama_decode")
            del session
            gc.collect()
            tp = talker_agreement(eager, t_out, threshold_db("talker", precision))
            split = f" (scheme {report.scheme['min_snr_db']:.1f} / lowering {report.lowering['min_snr_db']:.1f})" if report.scheme else ""
            gate = f"talker_decode {report.verdict} {report.min_snr_db:.1f} dB{split}"
            talker_part = part(f"GGUF {precision}", "code0", t_sec, gguf_bytes(files[0], talker, int(np.median(frames.positions))),
                               tp, report, gate)
            parts, engine = dict(talker=talker_part), f"edgex GGUF {precision} talker in llama.cpp (llama_decode)"
            if "gguf" in predictor_c.layouts and precision in ("f32", "f16", "q8_0"):
                dest = stage / f"code_predictor.{precision}.gguf"
                t0 = time.perf_counter()
                mmproj = gguf.export(predictor_c, precision, dest).files
                cost += f"; mmproj {time.perf_counter() - t0:.0f} s"
                report = run_parity(predictor_c, gguf, mmproj, "float32", precision, None, args.threads)
                frame_session = MtmdFrame(mmproj[0], args.threads)
                p_out, p_sec = time_calls(frame_session, pred_inputs)
                frame_session.gen.close()
                pp = predictor_agreement(talker, eager, p_out, zeros, threshold_db("predictor", precision))
                split = f" (scheme {report.scheme['min_snr_db']:.1f} / lowering {report.lowering['min_snr_db']:.1f})" if report.scheme else ""
                parts["predictor"] = part(f"llama.cpp mmproj {precision}", "codes", p_sec, mmproj_predictor_bytes(mmproj[0]), pp,
                                          report, f"code_predictor {report.verdict} {report.min_snr_db:.1f} dB{split}")
                engine = f"edgex GGUF {precision} talker (llama_decode) + llama.cpp's predictor (libmtmd, mmproj)"
            row = frame_row(engine, parts, cost)
            rows.append(row)
            console.print(json.dumps(row, default=str), soft_wrap=True)
        best = best_frame(rows[1:])
        if best is not None:
            rows.append(best)
            console.print(json.dumps(best, default=str), soft_wrap=True)

    eager_frame = rows[0]["frame_ms"]
    eager_talker = rows[0]["talker_ms"]
    table = Table(title=f"qwen3-tts {args.preset} frame on cpu, {args.threads} threads, {args.frames} frames from talker "
                        f"position {args.context}, medians; read bandwidth {bandwidth:.1f} GB/s; every engine on {cpu}")
    for col in ("engine", "talker ms", "predictor ms", "frame ms", "x eager", "MB read", "floor ms", "% of floor",
                "talker greedy code0", "predictor greedy codes", "gate (min dB)"):
        table.add_column(col)
    for r in rows:
        measured = r["frame_ms"] if r["frame_ms"] is not None else r["talker_ms"]
        ratio = measured / (eager_frame if r["frame_ms"] is not None else eager_talker)
        floor = r["bytes"] / bandwidth / 1e6
        r |= dict(ratio_to_eager=ratio, floor_ms=floor, share_of_floor=floor / measured)
        table.add_row(r["engine"], f"{r['talker_ms']:.1f}", "-" if r["predictor_ms"] is None else f"{r['predictor_ms']:.1f}",
                      "-" if r["frame_ms"] is None else f"{r['frame_ms']:.1f}",
                      f"{ratio:.3f}x" + ("" if r["frame_ms"] is not None else " (talker)"), f"{r['bytes'] / 1e6:.0f}",
                      f"{floor:.1f}", f"{100 * floor / measured:.0f} %", r["talker_parity"], r["predictor_parity"], r["gate"])
    Console(width=250).print(table)
    (args.out / "bench-frame.json").write_text(json.dumps(
        {"args": {k: str(v) for k, v in vars(args).items()}, "bandwidth_gbps": bandwidth, "cpu": cpu, "rows": rows}, indent=2, default=str))
    return 0
