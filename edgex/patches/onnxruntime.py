"""ONNX Runtime: its quantization calibrator's session on one thread.

This module is light: ONNX Runtime is imported inside.
"""

from __future__ import annotations

from .registry import REQUIRED, register


@register("onnxruntime.calibration_on_one_thread", kind=REQUIRED, checked={"onnxruntime": "1.32.0"},
          symbols=("onnxruntime.quantization.calibrate.CalibraterBase.create_inference_session",),
          saves="calibration ranges that do not depend on the process's thread count, so that `edgex verify` makes "
                "the same QDQ graph (the same digest) as the export did",
          no_op="a process already on one thread: the session is the calibrator's own but for its thread counts",
          upstream="`CalibraterBase` could take session options")
def calibrator_session_on_one_thread():
    """ONNX Runtime's calibrator session (`CalibraterBase.create_inference_session`, which takes no
    session options) made with one intra- and one inter-op thread for the duration, the graph
    optimizations off as the calibrator's own session has them."""
    import onnxruntime
    from onnxruntime.quantization.calibrate import CalibraterBase

    def one_thread(self):
        options = onnxruntime.SessionOptions()
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL  # as the calibrator's own
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self.infer_session = onnxruntime.InferenceSession(self.augmented_model_path, sess_options=options,
                                                          providers=self.execution_providers)

    made = CalibraterBase.create_inference_session
    CalibraterBase.create_inference_session = one_thread
    try:
        yield
    finally:
        CalibraterBase.create_inference_session = made
