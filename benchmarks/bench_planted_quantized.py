"""Planted-file-bug matrix for stored quantized tensors (tiny qwen3-tts `talker_decode`, seed 0).

Each bug is written into the exported file only: one layer's weight scales x2 (layer 0's
down-projection), its zero points one step off (asymmetric schemes), one head of layer 0's q_proj
zeroed (ONNX, GGUF, Core ML, QNN: here; ExecuTorch, MNN: `tests/planted_files.py`, shared with their
tests). Each row: the stored-tensor verdict (`edgex.parity.quantized`), its lowest agreement with the
independent quantizer, the tensor it names, and the model-parity verdict of the run alone.

    PYTHONPATH=. python benchmarks/bench_planted_quantized.py [FORMAT[:PRECISION] ...]   (default: every format)

FORMAT: onnx, gguf, executorch, mnn, coreml (a real `.mlpackage`), qnn (s25-htp context binary and
`.dlc`), or qnn-context / qnn-dlc for one of the two; `:PRECISION` keeps one precision of it.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from edgex.export import run_parity
from edgex.exporters import EXPORTERS
from edgex.parity.quantized import quantized_parity
from edgex.recipes import RECIPES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from planted_files import plant_mnn, plant_pte  # noqa: E402

LAYER = "model.layers.0"
HEAD_DIM = 16  # tiny talker: 4 heads of 16


def _onnx_bug(path: Path, bug: str, precision: str) -> bool:
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    prefix = f"edgex.linear.{LAYER}"

    def edit(name, fn):
        t = inits[name]
        t.CopyFrom(numpy_helper.from_array(fn(numpy_helper.to_array(t)), name))

    if bug == "scales x2":
        edit(f"{prefix}.mlp.down_proj_scales", lambda a: a * 2)
    elif bug == "zero points +1":
        name = f"{prefix}.mlp.down_proj_zero_points"
        if name not in inits:
            return False
        edit(name, lambda a: (a & 0xF0) | np.minimum((a & 0x0F) + 1, 15))  # every even block's zero point one step up
    else:  # head 0 of q_proj zeroed: its rows' codes set to the zero point (8 for int4 with zero points ~ mid)
        q = next(n for n in inits if n.startswith(f"{prefix}.self_attn.q_proj_Q"))
        bits = 4 if precision == "8da4w" else 8

        def zero_head(a):
            a = a.copy()
            rows = a.shape[0] // 8
            a[:rows] = 0x88 if bits == 4 else 128
            return a

        edit(q, zero_head)
        zp = f"{prefix}.self_attn.q_proj_zero_points"
        if zp in inits:
            edit(zp, lambda a: np.where(np.arange(a.size).reshape(a.shape) < a.size // 8, 0x88, a).astype(a.dtype))
    data = path.with_name(path.name + ".data")
    data.unlink()
    onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=data.name)
    return True


def _gguf_bug(path: Path, bug: str, precision: str) -> bool:
    import gguf

    if bug == "zero points +1":
        return False  # ggml's Q8_0 / Q4_0 store no zero point
    reader = gguf.GGUFReader(str(path), "r+")
    tensors = {t.name: t for t in reader.tensors}
    name = "blk.0.ffn_down.weight" if bug == "scales x2" else "blk.0.attn_q.weight"
    t = tensors[name]
    block = 34 if precision == "q8_0" else 18
    raw = t.data.reshape(-1, block)
    if bug == "scales x2":
        scales = raw[:, :2].copy().view(np.float16) * np.float16(2)
        raw[:, :2] = scales.view(np.uint8)
    else:
        rows = t.data.shape[0] // 8
        t.data[:rows] = 0
    reader.data.flush()
    return True


def _qdq_constant(component, precision: str, suffix: str) -> tuple[str, np.ndarray, float, int]:
    """(name, integers, scale, zero point) of the QDQ graph's constant made from the eager weight
    whose name ends with `suffix` (ONNX MatMul weights are the eager weight transposed)."""
    import edgex.exporters.qnn as qnn
    from edgex.exporters.qdq_scheme import dequantized_constants, float_name

    weight = next(p for n, p in component.module.named_parameters() if n.endswith(suffix)).detach().numpy().T
    graph, _ = qnn.GRAPHS.get(component, precision, None)
    float_graph, _ = qnn.GRAPHS.get(component, "fp16", None)
    floats = {i.name: numpy_helper.to_array(i) for i in onnx.load(str(float_graph)).graph.initializer}
    for name, (_, q, scale, zero, _axis) in dequantized_constants(onnx.load(str(graph))).items():
        original = floats.get(float_name(name))
        if original is not None and original.shape == weight.shape and np.array_equal(original, weight):
            return name, q, float(np.reshape(scale, -1)[0]), int(np.reshape(zero, -1)[0])
    raise LookupError(f"no QDQ constant made from {suffix}")


def _replace_once(path: Path, old: bytes, new: bytes) -> bool:
    data = path.read_bytes()
    at = data.find(old)
    if at < 0:
        return False
    path.write_bytes(data[:at] + new + data[at + len(old):])
    return True


def _qnn_bug(component, precision: str, path: Path, bug: str) -> str | None:
    """Plant `bug` in the written context binary (`.bin`) or `.dlc`; None, or why it cannot be planted.
    Binary: none is planted here. A uint8 MatMul weight is stored as signed int8 codes with its
    zero point folded in (q - zero point), tiled 4 input channels at a time: 4-value runs of a
    column of (q - zero point) are found (64 / 64 probes on the [64, 3072] head, 56 / 64 and 64 / 64
    on two [64, 128] weights of the w8a16 binary), 8-value runs and the uint8 codes as stored (or
    xor 0x80) never, 4-value runs of a row 1 / 64 (chance). A 4-byte run also matches by chance, and the tile order is undocumented, so an edit there (a head zeroed,
    every code one step off for a zero point +1) is not placed with certainty. The float32 copy of
    each scale it holds is not what the HTP computes with (down_proj's doubled there, the w8a16 run
    is unchanged: lowering 18.1 dB either way): the scale is folded into fixed-point requantization
    parameters whose layout is undocumented. `.dlc`: QNN's
    scale-offset pair (float32 scale, int32 -zero point) in the graph member and the integers,
    as stored or transposed, in `model.params.bin` (stored zip members, so file offsets)."""
    down = _qdq_constant(component, precision, f"{LAYER}.mlp.down_proj.weight")
    if path.suffix == ".bin":
        return "not located in the HTP binary (tiled integers; the scale it stores is not the one it computes with)"
    if bug in ("scales x2", "zero points +1"):
        _, _, scale, zero = down
        if zero == 0:  # the default offset is not written: the scale stands alone
            if bug == "zero points +1":
                return "zero point 0 is not written in the .dlc (the field's default)"
            ok = _replace_once(path, np.float32(scale).tobytes(), np.float32(scale * 2).tobytes())
            return None if ok else "scale not found"
        pair = np.float32(scale).tobytes() + np.int32(-zero).tobytes()
        planted = (np.float32(scale * 2).tobytes() + np.int32(-zero).tobytes() if bug == "scales x2"
                   else np.float32(scale).tobytes() + np.int32(-(zero + 1)).tobytes())
        return None if _replace_once(path, pair, planted) else "scale-offset pair not found"
    _, q, _, zero = _qdq_constant(component, precision, f"{LAYER}.self_attn.q_proj.weight")
    zeroed = q.copy()
    zeroed[:, :HEAD_DIM] = zero  # head 0: its output columns at the zero point
    for layout in (lambda a: a, lambda a: a.T):
        if _replace_once(path, np.ascontiguousarray(layout(q)).tobytes(), np.ascontiguousarray(layout(zeroed)).tobytes()):
            return None
    return "q_proj integers not found"


def qnn_rows(component, precisions=("w8a16", "w8a8", "w4a16"), kinds=("qnn-context", "qnn-dlc")) -> None:
    """QNN w8a16 / w8a8 / w4a16 on s25-htp: each bug planted in the context binary (whose run is the
    check that reads it) and in the `.dlc` (which nothing here runs: its stored tensors are)."""
    from edgex.parity.tensors import tensor_parity
    from edgex.targets import get_target

    exporter, options = EXPORTERS.get("qnn"), get_target("s25-htp").exporter_options["qnn"]
    with tempfile.TemporaryDirectory() as tmp:
        for precision in precisions:
            folder = Path(tmp) / precision
            folder.mkdir()
            result = exporter.export(component, precision, folder / f"talker_decode.{precision}.qnn.onnx", **options)
            pristine = Path(tmp) / f"{precision}-pristine"
            shutil.copytree(folder, pristine)
            for kind, files in (("qnn-context", result.files), ("qnn-dlc", result.sidecars[0].files)):
                if kind not in kinds:
                    continue
                target = files[-1] if kind == "qnn-context" else files[0]
                for bug in ("faithful", "scales x2", "zero points +1", "head zeroed"):
                    shutil.rmtree(folder)
                    shutil.copytree(pristine, folder)
                    why = None if bug == "faithful" else _qnn_bug(component, precision, target, bug)
                    if why:
                        print(f"{kind + ':' + precision:18s} {bug:16s} n/a ({why})")
                        continue
                    block = quantized_parity(exporter, component, files, precision, options)
                    if kind == "qnn-context":
                        report = run_parity(component, exporter, files, result.io_float_dtype, precision, None, None, options)
                        run = f"{report.verdict} (lowering {report.lowering['min_snr_db']:.1f} dB)"
                    else:
                        tensors = tensor_parity(exporter, component, files, 60.0, precision, options)
                        run = f"not run; bytes {tensors['verdict']}"
                    named = block["failures"][0].split(":")[0] if block["failures"] else ""
                    print(f"{kind + ':' + precision:18s} {bug:16s} {block['verdict']:14s} {block['min_agreement_db']:16.1f}  {run:10s} {named}")


def _coreml_bug(package: Path, bug: str, precision: str) -> str | None:
    """Plant `bug` in the `.mlpackage`'s weight file; None, or why it cannot be planted. The
    compressed weights (`constexpr_blockwise_shift_scale`, read with coremltools' MIL loader as
    the checks do) are located in `weight.bin` by their bytes: fp16 scales, int8 codes, int4 codes
    packed two to a byte, low nibble first."""
    from edgex.parity.mil.interpreter import load_program

    if bug == "zero points +1":
        return "linear symmetric: no zero point stored"
    ops = {op.name: op for op in load_program(package).operations if op.op_type == "constexpr_blockwise_shift_scale"}
    path = next(package.rglob("weight.bin"))
    if bug == "scales x2":
        op = next(o for n, o in ops.items() if "layers_0_mlp_down_proj" in n)
        scale = np.asarray(op.inputs["scale"].val, np.float16)
        ok = _replace_once(path, scale.tobytes(), (scale * np.float16(2)).tobytes())
        return None if ok else "down_proj scales not found in weight.bin"
    op = next(o for n, o in ops.items() if "layers_0_self_attn_q_proj" in n)
    codes = np.asarray(op.inputs["data"].val).astype(np.int8)  # [out, in]
    zeroed = codes.copy()
    zeroed[:HEAD_DIM] = 0  # head 0: its output rows

    def stored(a):
        if precision == "w8":
            return a.tobytes()
        nibbles = (a.reshape(-1) & 0x0F).astype(np.uint8)
        return (nibbles[0::2] | (nibbles[1::2] << 4)).tobytes()

    return None if _replace_once(path, stored(codes), stored(zeroed)) else "q_proj codes not found in weight.bin"


def coreml_rows(component) -> None:
    """Core ML w8 / w4 on a real `.mlpackage`: each bug planted in its weight file; the run is the
    MIL interpreter's (`simulated`) where Core ML itself needs macOS."""
    exporter = EXPORTERS.get("coreml")
    with tempfile.TemporaryDirectory() as tmp:
        for precision in ("w8", "w4"):
            folder = Path(tmp) / precision
            folder.mkdir()
            files = exporter.export(component, precision, folder / f"talker_decode.{precision}.mlpackage").files
            pristine = Path(tmp) / f"{precision}-pristine"
            shutil.copytree(folder, pristine)
            for bug in ("faithful", "scales x2", "zero points +1", "head zeroed"):
                shutil.rmtree(folder)
                shutil.copytree(pristine, folder)
                why = None if bug == "faithful" else _coreml_bug(files[0], bug, precision)
                if why:
                    print(f"{'coreml:' + precision:18s} {bug:16s} n/a ({why})")
                    continue
                block = quantized_parity(exporter, component, files, precision)
                report = run_parity(component, exporter, files, "float32", precision, None, None)
                run = f"{report.verdict} (lowering {report.lowering['min_snr_db']:.1f} dB)"
                named = block["failures"][0].split(":")[0] if block["failures"] else ""
                print(f"{'coreml:' + precision:18s} {bug:16s} {block['verdict']:14s} {block['min_agreement_db']:16.1f}  {run:10s} {named}")


def main() -> None:
    recipe = RECIPES.get("qwen3-tts")
    (component,) = recipe.components(recipe.load("tiny", None, 0), ["talker_decode"])
    pte = lambda path, bug, _precision: plant_pte(path, component, bug)  # noqa: E731
    mnn = lambda path, bug, _precision: plant_mnn(path, component, bug)  # noqa: E731
    cases = [("onnx", "8da8w", _onnx_bug), ("onnx", "8da4w", _onnx_bug), ("gguf", "q8_0", _gguf_bug), ("gguf", "q4_0", _gguf_bug),
             ("executorch", "8da8w", pte), ("executorch", "8da4w", pte), ("mnn", "w8", mnn), ("mnn", "w4", mnn)]
    only = [a.split(":") for a in sys.argv[1:]]  # optional: FORMAT[:PRECISION] to run

    def wanted(name, precision=None):
        return not only or any(o[0] in (name, f"{name}-context", f"{name}-dlc") and (len(o) == 1 or precision in (None, o[1]))
                               for o in only)

    cases = [case for case in cases if wanted(case[0], case[1])]
    print(f"{'format:precision':18s} {'bug':16s} {'stored tensors':14s} {'min agreement dB':>16s}  {'run alone':10s} named")
    with tempfile.TemporaryDirectory() as tmp:
        for name, precision, plant in cases:
            exporter = EXPORTERS.get(name)
            folder = Path(tmp) / f"{name}-{precision}"
            folder.mkdir()
            dest = folder / f"talker_decode.{precision}{exporter.extension}"
            files = exporter.export(component, precision, dest).files
            pristine = Path(tmp) / f"{name}-{precision}-pristine"
            shutil.copytree(folder, pristine)
            for bug in ("faithful", "scales x2", "zero points +1", "head zeroed"):
                shutil.rmtree(folder)
                shutil.copytree(pristine, folder)
                if bug != "faithful" and not plant(dest, bug, precision):
                    print(f"{name + ':' + precision:18s} {bug:16s} {'n/a (no zero points in this scheme)'}")
                    continue
                block = quantized_parity(exporter, component, files, precision)
                run = "-" if name == "gguf" and "llama_cpp" not in sys.modules and not _has_llama() else \
                    run_parity(component, exporter, files, "float32", precision, None, 1).verdict
                named = block["failures"][0].split(":")[0] if block["failures"] else ""
                print(f"{name + ':' + precision:18s} {bug:16s} {block['verdict']:14s} {block['min_agreement_db']:16.1f}  {run:10s} {named}")
    if wanted("coreml"):
        coreml_rows(component)
    if wanted("qnn"):
        precisions = [p for p in ("w8a16", "w8a8", "w4a16") if wanted("qnn", p)]
        kinds = [k for k in ("qnn-context", "qnn-dlc") if not only or any(o[0] in ("qnn", k) for o in only)]
        qnn_rows(component, precisions, kinds)


def _has_llama() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
