"""Let torchvision import beside the CPU torch build when its C++ ops cannot load.

The registry's torchvision 0.28.0 (the release paired with torch 2.13.0) is a CUDA build: its `_C`
extension links libtorch_cuda, so on the CPU torch edgex pins its ops (nms, roi_align, ...) are
never registered, and `torchvision._meta_registrations`, which registers fake kernels for those
ops, raises at import. transformers imports torchvision whenever it is installed (image utils), so
without this every Qwen3-TTS, MiniCPM-o or Spark-X2.5 load would fail too. When the ops did not
load, that one module is replaced by an empty one; torchvision's Python models and transforms, all
the VLA policies use, work as before. Where the ops load, nothing changes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

SKIPPED = "torchvision._meta_registrations"


class _SkipFakeKernelsWithoutOps(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname != SKIPPED:
            return None
        from torchvision import extension  # already imported: torchvision loads it first

        return None if extension._has_ops() else importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        pass


def install() -> None:
    if not any(isinstance(f, _SkipFakeKernelsWithoutOps) for f in sys.meta_path):
        sys.meta_path.insert(0, _SkipFakeKernelsWithoutOps())
