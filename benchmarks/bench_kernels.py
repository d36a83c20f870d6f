"""Benchmark (not a test): the quantized matmul kernels' own floor for a Qwen3-TTS frame.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_kernels.py --preset 0.6b --threads 1,2

A frame (one talker step + the 15-codebook predictor frame) is, at batch 1, a run of matrix-vector
products over every linear weight it reads: 0.44 G weights in the 0.6b talker and 15 x 0.08 G in
the predictor. This times, in one process, a chain of such products (1024 <-> 3072, the MLP
shapes; enough layers that the weights do not fit the last-level cache) in each scheme edgex
exports for the CPU: ONNX Runtime's fp32 MatMul and `MatMulNBits` (8da4w: int4, blocks of 32 with
zero points; its symmetric and block-128 variants; 8da8w), and ExecuTorch XNNPACK's 8da4w. It
prints microseconds per million weights, the weight bytes streamed per second, and the frame's
matmul-only time at that rate (weights per frame x rate): a floor for the whole frame in that
scheme, whatever the graph around the matmuls does. Medians of --runs calls after a warm-up; read
the ratios (the machine is shared)."""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
from bench_cpu import median_seconds

K, N = 1024, 3072  # hidden and MLP width of the 0.6b talker and predictor


def frame_weights(preset: str) -> dict[str, int]:
    """Linear weights a frame reads, from the preset's configuration: the talker's decoder layers and
    codec head once, the predictor's layers 15 times plus one of its 15 heads per codebook."""
    from edgex.recipes.qwen3_tts.presets import get_preset

    def layer(c: dict) -> int:
        q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
        h = c["hidden_size"]
        return h * q + 2 * h * kv + q * h + 3 * h * c["intermediate_size"]

    talker = get_preset(preset).talker
    predictor = talker["code_predictor_config"]
    groups = talker["num_code_groups"] - 1
    return {"talker": talker["num_hidden_layers"] * layer(talker) + talker["hidden_size"] * talker["vocab_size"],
            "predictor": groups * (predictor["num_hidden_layers"] * layer(predictor) + predictor["hidden_size"] * predictor["vocab_size"])}


def _chain(layers: int, seed: int = 0):
    """An fp32 ONNX model: x [1, 1, K] through `layers` alternating K->N and N->K MatMuls."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        shape = (K, N) if i % 2 == 0 else (N, K)
        weights.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.02).astype(np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"h{i}"]))
        x = f"h{i}"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, K])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, 1, K])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def onnx_variants(layers: int) -> dict[str, tuple[bytes, float]]:
    """{scheme: (serialized model, bytes per weight)} for ONNX Runtime."""
    import onnx
    from onnxruntime.quantization import matmul_nbits_quantizer as nbits

    from edgex.exporters.onnx import ACCURACY_LEVEL

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    base = _chain(layers)
    out = {"onnx fp32 MatMul": (base.SerializeToString(), 4.0)}
    for label, bits, block, symmetric in (("onnx 8da4w (int4, 32-blocks, zero points)", 4, 32, False),
                                          ("onnx int4, 32-blocks, symmetric", 4, 32, True),
                                          ("onnx int4, 128-blocks, symmetric", 4, 128, True),
                                          ("onnx 8da8w (int8, 32-blocks)", 8, 32, True)):
        quantizer = nbits.MatMulNBitsQuantizer(onnx.ModelProto.FromString(base.SerializeToString()), bits=bits, block_size=block,
                                               is_symmetric=symmetric, accuracy_level=ACCURACY_LEVEL)
        quantizer.process()
        per_weight = bits / 8 + 4 / block + (0 if symmetric else bits / 8 / block)
        out[label] = (quantizer.model.model.SerializeToString(), per_weight)
    return out


def time_onnx(model: bytes, threads: int, runs: int) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = threads, 1, 3
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feed = {"x": np.random.default_rng(1).standard_normal((1, 1, K)).astype(np.float32)}
    return median_seconds(lambda: session.run(None, feed), runs)[0]


def xnnpack_8da4w(layers: int, dest: Path) -> Path:
    """The same chain as torch Linears, quantized and lowered as edgex's ExecuTorch 8da4w."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import EdgeCompileConfig, to_edge_transform_and_lower
    from torchao.quantization import quantize_
    from torchao.quantization.granularity import PerGroup
    from torchao.quantization.quant_api import Int8DynamicActivationIntxWeightConfig

    torch.manual_seed(0)
    chain = torch.nn.Sequential(*(torch.nn.Linear(K, N, bias=False) if i % 2 == 0 else torch.nn.Linear(N, K, bias=False)
                                  for i in range(layers))).eval()
    quantize_(chain, Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
    program = to_edge_transform_and_lower(torch.export.export(chain, (torch.randn(1, K),)), partitioner=[XnnpackPartitioner()],
                                          compile_config=EdgeCompileConfig(_check_ir_validity=False)).to_executorch()
    dest.write_bytes(program.buffer)
    return dest


def time_pte(path: Path, threads: int, runs: int) -> float:
    import torch
    from executorch.runtime import Runtime

    torch.set_num_threads(threads)  # XNNPACK's pool follows the process's thread setting
    method = Runtime.get().load_program(str(path)).load_method("forward")
    x = torch.randn(1, K)
    return median_seconds(lambda: method.execute([x]), runs)[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="0.6b")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--layers", type=int, default=32, help="chain length (32 x 3.1 M weights: 50 MB in int4, past a 32 MB cache)")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--no-executorch", action="store_true")
    args = parser.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    weights = frame_weights(args.preset)
    per_frame = sum(weights.values())
    chain_weights = args.layers * K * N
    rows = []
    variants = onnx_variants(args.layers)
    with tempfile.TemporaryDirectory() as tmp:
        pte = None if args.no_executorch else xnnpack_8da4w(args.layers, Path(tmp) / "chain.pte")
        for threads in (int(t) for t in args.threads.split(",")):
            for label, (model, per_weight) in variants.items():
                rows.append((label, threads, time_onnx(model, threads, args.runs), per_weight))
            if pte is not None:
                rows.append(("executorch 8da4w (XNNPACK, 32-groups)", threads, time_pte(pte, threads, args.runs), None))
    table = Table(title=f"matmul kernels, {args.preset} frame = {weights['talker'] / 1e6:.0f} M talker + "
                        f"{weights['predictor'] / 1e6:.0f} M predictor weights")
    for col in ("scheme", "threads", "us per M weights", "GB/s of weights", "x fp32 MatMul time per weight", "frame matmuls ms"):
        table.add_column(col, justify="left" if col == "scheme" else "right")
    fp32 = {t: s for label, t, s, _ in rows if label == "onnx fp32 MatMul"}
    for label, threads, seconds, per_weight in rows:
        per_m = seconds / chain_weights * 1e6 * 1e6
        streamed = "-" if per_weight is None else f"{chain_weights * per_weight / seconds / 1e9:.1f}"  # XNNPACK's packing: not read here
        table.add_row(label, str(threads), f"{per_m:.1f}", streamed,
                      f"{seconds / fp32[threads]:.3f}", f"{per_m * per_frame / 1e6 / 1e3:.1f}")
    Console(width=200).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
