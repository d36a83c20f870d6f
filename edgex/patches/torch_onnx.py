"""torch.onnx: torchlib's registry of ATen translations built once per process.

This module is light: torch is imported inside.
"""

from __future__ import annotations

from .registry import SPEED_UP, register

REGISTRIES: dict = {}  # (registry class, opset) -> the registry torchlib gave it


@register("torch_onnx.torchlib_registry_built_once", kind=SPEED_UP, checked={"torch": "2.13.0", "onnxscript": "0.7.2"},
          symbols=("torch.onnx._internal.exporter._registration.ONNXRegistry.from_torchlib",
                   "torch.onnx._internal.exporter._constants.TORCHLIB_OPSET"),
          saves="seconds of every `torch.onnx.export` call, whatever the graph (the registry of torchlib's "
                "translations rebuilt on each call): with the mixed-dtype skip, the 0.6b cpu export 9:46 -> 9:19",
          no_op="the first export of a process and opset builds the registry as before",
          upstream="`torch.onnx.export` could accept a registry, or cache torchlib's per opset")
def torchlib_registry_built_once():
    """`torch.onnx.export` builds its registry of torchlib's ATen translations anew on every call,
    seconds of each export whatever the graph: within this context it is built once per process and
    opset, in the exporter's warm-up before jobs fork, and each export gets its own copy (the same
    translations; registering a custom one changes that copy only)."""
    from torch.onnx._internal.exporter._constants import TORCHLIB_OPSET
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    build = ONNXRegistry.__dict__["from_torchlib"]

    def from_torchlib(cls, opset_version=TORCHLIB_OPSET):
        if (cls, opset_version) not in REGISTRIES:
            REGISTRIES[cls, opset_version] = build.__func__(cls, opset_version=opset_version)
        built = REGISTRIES[cls, opset_version]
        registry = cls()
        registry.__dict__.update(built.__dict__)
        registry.functions = {target: list(decompositions) for target, decompositions in built.functions.items()}
        return registry

    ONNXRegistry.from_torchlib = classmethod(from_torchlib)
    try:
        yield
    finally:
        ONNXRegistry.from_torchlib = build
