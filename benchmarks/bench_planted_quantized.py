"""Planted-file-bug matrix for stored quantized tensors (tiny qwen3-tts `talker_decode`, seed 0).

Each bug is written into the exported file only: one layer's weight scales x2 (layer 0's
down-projection), its zero points one step off (asymmetric schemes), one head of layer 0's q_proj
zeroed (ONNX, GGUF: here; ExecuTorch, MNN: `tests/planted_files.py`, shared with their tests).
Each row: the stored-tensor verdict (`edgex.parity.quantized`), its lowest agreement with the
independent quantizer, the tensor it names, and the model-parity verdict of the run alone.

    PYTHONPATH=. python benchmarks/bench_planted_quantized.py [FORMAT ...]   (default: every format)
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


def main() -> None:
    recipe = RECIPES.get("qwen3-tts")
    (component,) = recipe.components(recipe.load("tiny", None, 0), ["talker_decode"])
    pte = lambda path, bug, _precision: plant_pte(path, component, bug)  # noqa: E731
    mnn = lambda path, bug, _precision: plant_mnn(path, component, bug)  # noqa: E731
    cases = [("onnx", "8da8w", _onnx_bug), ("onnx", "8da4w", _onnx_bug), ("gguf", "q8_0", _gguf_bug), ("gguf", "q4_0", _gguf_bug),
             ("executorch", "8da8w", pte), ("executorch", "8da4w", pte), ("mnn", "w8", mnn), ("mnn", "w4", mnn)]
    only = sys.argv[1:]  # optional: format names to run
    cases = [case for case in cases if not only or case[0] in only]
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


def _has_llama() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return False
    return True


if __name__ == "__main__":
    main()
