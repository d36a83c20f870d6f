"""GGUF for llama.cpp, written with `gguf` (llama.cpp's own gguf-py) from the component's layout.

The file's contents (architecture, tensor names, metadata keys, how inputs feed the graph) are
whatever the component declares in `Component.layouts["gguf"]` (`edgex.layouts.GgufLayout`); this
module only types the metadata, quantizes and writes. Quantization is gguf-py's reference
implementation of ggml's block formats: `q8_0` (int8, one fp16 scale per 32 weights) and `q4_0`
(int4, one fp16 scale per 32). As in llama.cpp's converter, 1-D tensors stay F32 and a matrix
whose rows are not a whole number of blocks falls back to F16. Every tensor the file stores is read
back with gguf's reader, dequantized and scored against the original weight (`stored_tensors`, the
manifest's `tensor_parity`, repeated by `edgex verify`): the model-level parity, from running the
file in llama.cpp, never reads the token embedding rows of a graph fed embeddings.

k-quants are not offered: ggml's k-quants work on super-blocks of 256 weights per row, wider
than every row of the tiny preset (64/128), where llama.cpp's quantizer would silently substitute
other types — the artifact would not be what its name says.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from . import EXPORTERS
from .base import Exporter, ExportResult, StoredTensor

if TYPE_CHECKING:
    import numpy as np

    from ..component import Component
    from ..layouts import GgufLayout

# precision -> (ggml type name for 2-D weights, llama_ftype recorded as general.file_type)
_SCHEMES = {"f32": ("F32", 0), "f16": ("F16", 1), "q8_0": ("Q8_0", 7), "q4_0": ("Q4_0", 2)}
FEED_PREFIX = "edgex.feed."


def _add_metadata(writer, key: str, value) -> None:
    """Type a metadata value the way llama.cpp's loader expects it (it checks types strictly)."""
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        if value < 0:
            raise ValueError(f"GGUF metadata {key}: {value} is negative; only unsigned ints are written")
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif isinstance(value, (list, tuple)) and value and len({type(v) for v in value}) == 1 and isinstance(value[0], (bool, int, str)):
        writer.add_array(key, list(value))
    else:
        raise ValueError(f"GGUF metadata {key}: cannot type {value!r}")


def tensor_type(gguf, name: str, array: np.ndarray, precision: str, keep_f32: tuple[str, ...], type_rule=None):
    """The ggml type one tensor is stored as under `precision` (`type_rule`: the layout's own
    rule, `GgufLayout.type_rule`)."""
    types = gguf.GGMLQuantizationType
    rule = type_rule(name) if type_rule else None
    if array.ndim < 2 or name in keep_f32 or rule == "F32":
        return types.F32
    if rule == "F16":  # the layout's rule holds at every precision, f32 included (as llama.cpp's converter's)
        return types.F16
    if precision == "f32":
        return types.F32
    qtype = types[_SCHEMES[precision][0]]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    return qtype if array.shape[-1] % block == 0 else types.F16


@EXPORTERS.register("gguf")
class GgufExporter(Exporter):
    name = "gguf"
    format = "gguf"
    backend = "llama.cpp-cpu"
    extension = ".gguf"
    runtime = "llamacpp"
    precisions = tuple(_SCHEMES)
    schemes = {  # what each precision means in this format, one line each (edgex list)
        "f32": "GGUF F32 tensor storage (llama.cpp's converter: --outtype f32); fp32 compute",
        "f16": "GGUF F16 tensor storage; llama.cpp's CPU kernels compute in fp32 (not the fp16 scheme)",
        "q8_0": "ggml Q8_0: int8 weights in blocks of 32, one fp16 scale per block; fp32 compute",
        "q4_0": "ggml Q4_0: int4 weights in blocks of 32, one fp16 scale per block; fp32 compute",
    }
    requires = ("gguf", "llama_cpp")
    # llama.cpp's CPU backend runs its threads on GNU OpenMP: in a child forked from a process that
    # has run a GGUF, decoding hangs (seen in the suite: `_Session._decode` idle forever).
    fork_safe = False

    def stored_scheme(self, component: Component, precision: str, files: list[Path], **_options):
        """Read from the file: every non-F32 tensor dequantized by gguf-py, paired with the layout's
        float tensor of the same name. llama.cpp computes in fp32 on these weights, so F16 is a
        weight scheme like the block formats; activations are not quantized."""
        import gguf
        import numpy as np
        import torch

        from ..parity.scheme import StoredScheme, StoredWeight


        originals = component.layouts["gguf"].tensors()
        weights = {}
        for tensor in gguf.GGUFReader(str(files[0])).tensors:
            if tensor.tensor_type == gguf.GGMLQuantizationType.F32:
                continue
            original = originals[tensor.name]
            stored = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(original.shape)
            weights[tensor.name] = StoredWeight(torch.from_numpy(original), torch.from_numpy(np.ascontiguousarray(stored, np.float32)))
        if not weights:
            return None  # every tensor F32: the eager model is the reference
        return StoredScheme("read from the file (gguf-py dequantize)", weights)

    def stored_quantized(self, component: Component, files: list[Path], precision: str, **_options):
        """Every non-F32 tensor of the file, dequantized by gguf-py, beside the layout's float tensor:
        block-quantized ones against ggml's block format, F16 fallbacks against fp16 rounding."""
        import gguf
        import numpy as np

        from ..parity.quantized import QuantizedTensor
        from ..parity.quantizer import scheme_for

        if precision not in ("q8_0", "q4_0"):
            return None
        originals = component.layouts["gguf"].tensors()
        found = {}
        for tensor in gguf.GGUFReader(str(files[0])).tensors:
            if tensor.tensor_type == gguf.GGMLQuantizationType.F32:
                continue
            shape = tuple(int(n) for n in reversed(tensor.shape))  # ggml ne -> numpy order
            stored = np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32).reshape(shape)
            original = np.asarray(originals.get(tensor.name, np.zeros((0,))), np.float32)
            scheme = None if tensor.tensor_type == gguf.GGMLQuantizationType.F16 else scheme_for(self.name, tensor.tensor_type.name.lower())
            found[tensor.name] = QuantizedTensor(stored, original, scheme)
        return found

    def export(self, component: Component, precision: str, dest: Path) -> ExportResult:
        import gguf
        import numpy as np

        from ..layouts import FEED_INPUTS, FEED_OUTPUTS

        layout: GgufLayout | None = component.layouts.get("gguf")
        if layout is None:
            raise ValueError(f"component {component.name} declares no GGUF layout (Component.layouts['gguf'])")
        feed = layout.feed
        unknown = sorted((set(feed.inputs) - set(FEED_INPUTS)) | (set(feed.outputs) - set(FEED_OUTPUTS)))
        if unknown or len(feed.inputs) != len(component.inputs) or len(feed.outputs) != len(component.outputs):
            raise ValueError(f"component {component.name}'s GGUF feed does not match its inputs/outputs ({unknown or 'count'})")
        writer = gguf.GGUFWriter(str(dest), layout.architecture)
        for key, value in layout.metadata.items():
            _add_metadata(writer, key, value)
        if layout.metadata.get("general.type") == "mmproj":
            pass  # a projector file has no vocabulary: the text model's is used
        elif layout.vocab is None:
            writer.add_tokenizer_model("none")
        else:
            layout.vocab.write(writer)
        writer.add_file_type(_SCHEMES[precision][1])
        _add_metadata(writer, FEED_PREFIX + "inputs", list(feed.inputs))
        _add_metadata(writer, FEED_PREFIX + "outputs", list(feed.outputs))
        _add_metadata(writer, FEED_PREFIX + "logits_offset", feed.logits_offset)
        _add_metadata(writer, FEED_PREFIX + "positions_per_embd", feed.positions_per_embd)
        if feed.new_frames:
            _add_metadata(writer, FEED_PREFIX + "new_frames", feed.new_frames)

        types = set()
        for name, array in layout.tensors().items():
            array = np.ascontiguousarray(array, dtype=np.float32)
            qtype = tensor_type(gguf, name, array, precision, layout.keep_f32, layout.type_rule)
            writer.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
            types.add(qtype.name)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return ExportResult([dest], "float32", {"architecture": layout.architecture, "types": sorted(types)})

    def stored_tensors(self, component: Component, files: list[Path], precision: str, **_options) -> dict[str, StoredTensor]:
        """Every tensor in the file, dequantized by gguf's reference code, beside the layout's weight;
        the token embedding table (gguf-py's name for it) scored row by row, as a token reads it."""
        import numpy as np
        from gguf import MODEL_TENSOR, TENSOR_NAMES, GGUFReader, quants

        originals = component.layouts["gguf"].tensors()
        table = f"{TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD]}.weight"
        found = {}
        for t in GGUFReader(str(files[0])).tensors:
            shape = tuple(int(n) for n in reversed(t.shape))  # ggml ne -> numpy order
            restored = np.asarray(quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
            original = originals.pop(t.name, None)
            found[t.name] = StoredTensor(t.tensor_type.name, restored, None if original is None else np.asarray(original, np.float32),
                                         rows=t.name == table)
        for name in originals:  # declared by the layout, absent from the file
            found[name] = StoredTensor("absent", None, originals[name])
        return found
