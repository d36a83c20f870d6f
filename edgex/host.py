"""What this host is, as far as the verdicts edgex gives depend on it: the CPU features its
runtimes choose their kernels by (`edgex doctor` prints them), read without importing any toolchain.

XNNPACK sums fp16 products in fp16 where the CPU has fp16 arithmetic (AVX512-FP16, Arm), ONNX
Runtime's MLAS and llama.cpp pick int8 / bf16 / fp16 dot-product kernels by the same flags: the
same artifact can score differently on two hosts of one architecture. These features are in every
artifact's key (`edgex.artifacts.keys`), so a verdict measured on one host kind is never served on
another.
"""

from __future__ import annotations

import platform
from pathlib import Path

# The CPU features that choose the kernels edgex's runtimes run (XNNPACK, ONNX Runtime's MLAS,
# llama.cpp): x86 vector widths and int8 / bf16 / fp16 dot products, Arm's fp16 and int8 dot products.
SIMD_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
                 "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16", "asimd", "asimdhp", "asimddp", "fphp", "i8mm", "sve")


def _cpuinfo() -> dict[str, str]:
    """The first processor's `key: value` lines of /proc/cpuinfo; empty where there is none."""
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        if not line.strip():
            if info:
                break
            continue
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    return info


def cpu_model() -> str:
    """The CPU's name as the OS reports it."""
    info = _cpuinfo()
    return info.get("model name") or info.get("CPU part") or platform.processor() or platform.machine()


def cpu_features() -> list[str]:
    """Of `SIMD_FEATURES`, those this CPU reports (x86 `flags`, Arm `Features`), in that order."""
    info = _cpuinfo()
    present = set((info.get("flags") or info.get("Features") or "").split())
    return [f for f in SIMD_FEATURES if f in present]
