"""MNN `.mnn` from the component's ONNX graph, converted by MNN's own converter extension.

The converter is MNN's C extension `_tools.mnnconvert`, run in a child interpreter (it prints from
native code and may abort on a bad graph). Never `MNN.tools.mnnconvert`/`mnnquant` or the
`mnnconvert` script: importing `MNN.tools` pip-installs a logging SDK into the running interpreter
and uploads telemetry (docs/toolchains.md). Weight quantization is MNN's: int8 per channel (`w8`) and int4
in blocks of 32 along the input dimension (`w4`); `fp16` stores weights in half (MNN computes in
fp32 on x86). The converter's weight quantization has no per-layer exclusion, so a component's
`float_only` layers are quantized too; the manifest says so (`details.float_only`) and the parity
gate measures the result.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from . import EXPORTERS
from .base import ExportResult, Exporter
from .mnn_converter import run_converter
from .onnx import OnnxExporter

if TYPE_CHECKING:
    from ..component import Component

W4_BLOCK = 32
_FLAGS = {
    "fp32": [],
    "fp16": ["--fp16"],
    "w8": ["--weightQuantBits", "8"],
    "w4": ["--weightQuantBits", "4", "--weightQuantBlock", str(W4_BLOCK)],
}


def convert(onnx_path: Path, dest: Path, flags: list[str]) -> str:
    """Run MNN's converter on an ONNX file; returns its log."""
    argv = ["MNNConvert", "-f", "ONNX", "--modelFile", str(onnx_path.resolve()), "--MNNModel", str(dest.resolve()),
            "--bizCode", "edgex", *flags]
    return run_converter(argv, dest)


def external_weights(model: Path) -> Path:
    """Where MNN keeps a model's weights outside its `.mnn`: the converter writes them there for a
    graph over 2 GB (its flatbuffer's limit), `--saveExternalData` for any, and MNN's loaders read
    them from beside the model by this name. The `.mnn` alone then runs without error on zeros in
    their place, so the two are one artifact."""
    return model.with_name(model.name + ".weight")


def minmax_asymmetric(weight, bits: int, block: int | None):
    """Per output row (or per `block` inputs of a row): map [min, max] onto 2**bits levels."""
    import torch

    w = weight.detach().to(torch.float32)
    rows = w.reshape(w.shape[0], -1, block) if block else w.reshape(w.shape[0], 1, -1)
    low, high = rows.amin(-1, keepdim=True), rows.amax(-1, keepdim=True)
    scale = ((high - low) / (2**bits - 1)).clamp(min=1e-12)
    q = torch.clamp(torch.round((rows - low) / scale), 0, 2**bits - 1)
    return (q * scale + low).reshape(w.shape)


def converter_quantized(module, bits: int, block: int | None):
    """A linear or conv layer's weight as MNN's converter quantizes it (`WeightQuantAndCoding`): the
    weight buffer as the ONNX graph lays it out, cut into `out_features` / `out_channels` equal
    chunks (the converter's "per output channel"), each chunk cut further into blocks of `block`
    input channels times the kernel size when the chunk's input channels divide by `block`, and
    each block mapped asymmetrically onto 2**bits levels (`minmax_asymmetric`). For a Linear or a
    Conv a chunk is one output channel; a ConvTranspose's ONNX layout is [in, out / groups, k], so
    its chunks are runs of that buffer, not output channels (measured on single layers: this model
    gives 137.5 dB (w8) / 137.9 dB (w4) against the .mnn's output for a ConvTranspose1d 96 -> 48,
    k 8; quantizing per true output channel gives 46.0 / 22.0, no better than fp32)."""
    import torch
    from torch import nn

    weight = module.weight.detach().to(torch.float32)
    chunks = module.out_features if isinstance(module, nn.Linear) else module.out_channels
    flat = weight.reshape(chunks, -1)
    kernel = 1 if isinstance(module, nn.Linear) else math.prod(module.kernel_size)
    blocked = block if block and (flat.shape[1] // kernel) % block == 0 else None
    return minmax_asymmetric(flat, bits, blocked * kernel if blocked else None).reshape(weight.shape)


@EXPORTERS.register("mnn")
class MnnExporter(Exporter):
    name = "mnn"
    format = "mnn"
    backend = "mnn-cpu"
    extension = ".mnn"
    runtime = "mnn"
    precisions = tuple(_FLAGS)
    schemes = {  # what each precision means in this format, one line each (edgex list)
        "fp32": "float32 weights and compute",
        "fp16": "fp16 weight storage only (--fp16): MNN's x86 CPU computes in fp32, ARM CPUs may compute in fp16",
        "w8": "int8 weights per output channel (converter weight quantization), float compute, every layer",
        "w4": "int4 weights in blocks of 32 along the input (converter weight quantization), float compute, every layer",
    }
    requires = ("onnx", "onnxscript", "MNN")
    # The peak recorded here (2-core Xeon, 23 GiB) over the model's fp32 weights: 1.35 for the largest
    # process of a 1.01B-parameter speech model's whole export (5.45 GB; docs/troubleshooting.md). Below it.
    memory_factor = 1.2

    def stored_scheme(self, component: Component, precision: str, files: list[Path], **_options):
        """Read from the file: every quantized Convolution weight of the `.mnn` (`mnn_weights`),
        dequantized as MNN's loader does, swapped in for the module tensor it holds (paired by
        content, `_file_weights`). MNN dequantizes at load and computes in float, so activations
        are not quantized."""
        import numpy as np
        import torch

        from ..parity.scheme import StoredScheme, StoredWeight

        if precision not in ("w8", "w4"):
            return super().stored_scheme(component, precision, files)
        weights, notes = {}, []
        try:
            paired = self._file_weights(component, files)
        except ValueError as error:  # a coding `mnn_weights` does not decode
            return self._converter_scheme(component, precision, f"the file's weights not read back: {error}")
        for op, stored, name, original in paired:
            if name is None:
                notes.append(f"quantized weight of op {op} holds no tensor of the component")
                continue
            weights[name] = StoredWeight(original.detach(), torch.from_numpy(np.ascontiguousarray(stored.weight).reshape(original.shape)))
        return StoredScheme("read from the file (MNN Convolution weights, decoded as MNN's loader does)", weights, notes=notes)

    @staticmethod
    def _converter_scheme(component: Component, precision: str, why: str):
        """The converter's scheme applied in PyTorch (`converter_quantized`) to each linear layer the
        graph calls and every conv layer, for a file whose weights cannot be read back."""
        from torch import nn

        from ..parity.scheme import StoredScheme, StoredWeight, called_modules

        bits, block = (8, None) if precision == "w8" else (4, W4_BLOCK)
        convolutions = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
        linears = called_modules(component)
        layers = {name: m for name, m in component.module.named_modules()
                  if name in linears or isinstance(m, convolutions)}  # convs: also those applied via F.conv*
        weights = {f"{name}.weight": StoredWeight(m.weight, converter_quantized(m, bits, block)) for name, m in layers.items()}
        return StoredScheme(f"same scheme applied in PyTorch (MNN converter's asymmetric int{bits} chunks; {why})", weights)

    def stored_quantized(self, component: Component, files: list[Path], precision: str, **_options):
        """Every quantized Convolution weight of the `.mnn`, dequantized from the file, beside the
        module tensor it holds, both as the file's scale groups lay them out (rows of output
        channels, blocks of 32 inputs x kernel where the converter blocked them), scored against
        the independent min / max quantizer."""
        import numpy as np

        from ..parity.quantized import QuantizedTensor
        from ..parity.quantizer import scheme_for, with_block

        if precision not in ("w8", "w4"):
            return None
        scheme = scheme_for(self.name, precision)
        try:
            paired = self._file_weights(component, files)
        except ValueError as error:  # a coding `mnn_weights` does not decode: unverified, never guessed
            return f"quantized weights of {files[0].name} not read back: {error}"
        found = {}
        for op, stored, name, original in paired:
            laid = np.zeros((0,), np.float32) if original is None else original.detach().float().numpy().reshape(stored.weight.shape)
            key = name or f"op {op}"
            found[key if key not in found else f"{key} (again, op {op})"] = QuantizedTensor(stored.weight, laid, with_block(scheme, stored.group))
        return found

    def _file_weights(self, component: Component, files: list[Path]):
        """(op name, `MnnWeight`, the name of the module tensor it holds or None, that tensor laid
        out as the file stores it) for every quantized Convolution weight of the `.mnn`. The
        converter names ops after ONNX nodes, so each is paired by content
        (`edgex.parity.quantized.paired_by_content`) with the component's float parameters and
        buffers (an RMS norm's mean column becomes a quantized 1 x n convolution)."""
        from ..parity.quantized import paired_by_content
        from .mnn_weights import quantized_weights

        tensors = {}
        for name, t in [*component.module.named_parameters(), *component.module.named_buffers()]:
            if t.is_floating_point() and t.ndim >= 1:
                tensors.setdefault(name, t)
        kept = external_weights(files[0])
        stored = quantized_weights(files[0], kept if kept.is_file() else None)
        pairs = paired_by_content({op: w.weight for op, w in stored.items()},
                                  {n: t.detach().float().numpy() for n, t in tensors.items()})
        out = []
        for op, weight in stored.items():
            hit = pairs[op]
            if hit is None:
                out.append((op, weight, None, None))
                continue
            name, transposed = hit
            original = tensors[name].t() if transposed else tensors[name]
            out.append((op, weight, name, original))
        return out

    def stored_constants(self, component: Component, files: list[Path], precision: str, **_options):
        """The `Const` variables of the graph as MNN's expression API loads them (a gather's table is
        one; linear and conv weights live inside their Convolution ops, which the runs read), and
        those it cannot read, kept in the weight file beside the `.mnn` (`external_weights`), as
        that file holds them."""
        import numpy as np

        from ..toolchain import native_output_silenced
        from .mnn_weights import external_constants

        with native_output_silenced():  # MNN prints its CPU features on stdout
            import MNN.expr as F

            variables = F.load_as_dict(str(files[0]))
            consts, unread = {}, []
            for name, v in variables.items():
                if v.op_type == "Const":
                    try:  # copied while the variables live: `read()` returns a view of memory MNN frees with them
                        consts[name] = np.array(v.read(), copy=True)
                    except (SystemError, TypeError):  # kept in the weight file beside the .mnn
                        unread.append(name)
        kept = external_weights(files[0])
        if unread and kept.is_file():
            stored = external_constants(files[0], kept)
            consts |= {name: stored[name] for name in unread if name in stored}
        return {name: a.astype(np.float32) for name, a in consts.items() if a.dtype.kind == "f"}

    def export(self, component: Component, precision: str, dest: Path) -> ExportResult:
        with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
            onnx_path = Path(tmp) / f"{component.name}.onnx"
            OnnxExporter().graph(component, "fp32", onnx_path)
            convert(onnx_path, dest, _FLAGS[precision])
        details = {"converter_flags": _FLAGS[precision]}
        weights = external_weights(dest)
        if weights.is_file():
            details["external_weights"] = weights.name
        if precision == "w4":
            details["block_size"] = W4_BLOCK
        if precision in ("w8", "w4") and component.float_only:
            details["float_only"] = f"not honoured (MNN's converter quantizes every weight): {', '.join(component.float_only)}"
        return ExportResult([dest, *([weights] if weights.is_file() else [])], "float32", details)
