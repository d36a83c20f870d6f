"""Static QDQ quantization for the HTP: ONNX Runtime's QNN quantizer config, calibrated on input sets
the recipe draws from the eager pipeline (`Component.calibration`), never on the parity samples, on
one thread."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import EdgexError
from ..patches.onnxruntime import calibrator_session_on_one_thread
from .onnx import nodes_from_modules
from .qnn_bias import own_biases
from .qnn_htp import fp16_on_htp, sampling_nodes

if TYPE_CHECKING:
    from ..component import Component


# scheme -> (weight type, activation type) as onnxruntime.quantization.QuantType names. `per_channel`
# applies to Conv / ConvTranspose kernels only: QNN's MatMul takes no per-channel weights, so the QNN
# quantizer config gives every MatMul weight one scale (measured: all 21 uint8 weights of a tiny LLM
# decode graph at w8a16 per tensor; a gather's table takes the activation type, uint16 per tensor).
SCHEMES = {"w8a16": ("QUInt8", "QUInt16"), "w4a16": ("QInt4", "QUInt16"), "w8a8": ("QUInt8", "QUInt8")}


# Weight types quantized symmetric (zero point 0) where ONNX Runtime's QNN config would make them
# asymmetric. The HTP mis-lowers int4 weights with a non-zero zero point: a tiny LLM decode graph's
# asymmetric int4 QDQ graph (zero points in -8 ... 7) scored 3.7 dB in the HTP simulator against
# the same graph on ONNX Runtime CPU (its key cache output; 19-20 dB the others),
# the same graph with symmetric int4 weights 39-41 dB (20.6 dB on the value cache, where the
# activation leaves its calibrated range, as at w8a16). Per-channel kernels are symmetric whatever this says.
_SYMMETRIC_WEIGHTS = ("QInt4",)


@contextmanager
def _calibration_on_one_thread():
    """Calibration as every export runs it (in a job's forked process, on one thread), whatever this
    process's thread count: `edgex verify` makes the QDQ graph again and refuses one whose digest
    differs, and a reduction split over another number of threads (the eager model's activations,
    ONNX Runtime's calibration session) can move a calibration range in its last bits. torch runs on
    one thread and ONNX Runtime's calibrator session with one intra- and one inter-op thread
    (`patches.onnxruntime.calibrator_session_on_one_thread`)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with calibrator_session_on_one_thread():
            yield
    finally:
        torch.set_num_threads(threads)


def quantize_qdq(source: Path, dest: Path, component: Component, precision: str, size: int) -> dict:
    """Static QDQ quantization for the HTP, calibrated on `size` input sets from the eager pipeline,
    on one thread (`_calibration_on_one_thread`)."""
    with _calibration_on_one_thread():
        return _quantize_qdq(source, dest, component, precision, size)


def _quantize_qdq(source: Path, dest: Path, component: Component, precision: str, size: int) -> dict:
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    if component.calibration is None:
        raise EdgexError(f"{component.name} provides no calibration data, which {precision} needs")
    sets = component.calibration(size)
    names = [s.name for s in component.inputs]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self._feeds = iter([{n: t.numpy() for n, t in zip(names, inputs)} for inputs in sets])

        def get_next(self):
            return next(self._feeds, None)

    weights, activations = SCHEMES[precision]
    source = own_biases(source, dest)
    float_only = nodes_from_modules(source, component.float_only)
    htp_fp16 = fp16_on_htp(source) + sampling_nodes(source, component)
    config = get_qnn_qdq_config(str(source), Reader(), activation_type=getattr(QuantType, activations),
                                weight_type=getattr(QuantType, weights), per_channel=True,
                                weight_symmetric=True if weights in _SYMMETRIC_WEIGHTS else None,
                                nodes_to_exclude=float_only + htp_fp16 or None)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer advises pre-processing through the root logger
    try:
        quantize(str(source), str(dest), config)
    finally:
        root.setLevel(level)
    return {"calibration_sets": len(sets), "calibration_method": "minmax", "weights": weights, "activations": activations,
            "float_only": {"patterns": list(component.float_only), "nodes": float_only}, "fp16_nodes": len(htp_fp16)}
