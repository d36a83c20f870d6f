"""ONNX Runtime's QNN execution provider (the `onnxruntime-qnn` plugin, QAIRT libraries from PyPI).

One place for the plumbing the `qnn` exporter and the HTP-simulator runtime share: registering the
plugin library with ONNX Runtime once per process, and session options for the HTP backend. On x86
the HTP backend runs graphs in QAIRT's HTP simulator; it can also compile a graph for a given SoC
into a context binary offline, and the IR backend writes the graph as a `.dlc`.
"""

from __future__ import annotations

from pathlib import Path

from .toolchain import native_output_silenced, require, version

EP_NAME = "QNNExecutionProvider"
_registered: list = []


def _devices():
    ort = require("onnxruntime", "running QNN graphs")
    if not _registered:
        qnn = require("onnxruntime_qnn", "building and running Qualcomm HTP context binaries")
        ort.register_execution_provider_library(EP_NAME, qnn.get_library_path())
        _registered.append(qnn)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    if not devices:
        raise RuntimeError("onnxruntime-qnn registered no QNN device")
    return ort, devices[:1]


def qairt_version() -> str | None:
    """The QAIRT (QNN SDK) version the installed onnxruntime-qnn bundles."""
    try:
        from onnxruntime_qnn.build_and_package_info import qnn_version
    except ImportError:
        return None
    return qnn_version


def plugin_version() -> str | None:
    return version("onnxruntime-qnn")


def htp_session(model: Path, *, soc_model: int | None = None, htp_arch: int | None = None, fp16: bool = False,
                context_out: Path | None = None, dlc_dir: Path | None = None, threads: int | None = None,
                fold_constants: bool = True):
    """An ONNX Runtime session whose whole graph runs on the QNN HTP backend (no CPU fallback: a node
    the HTP cannot take is an error, not a silent split).

    `context_out`: also compile the graph into an EPContext model there (+ its `.bin`, not embedded).
    `dlc_dir`: instead write the graph through the IR backend as `.dlc` (the IR backend session's outputs are
    not meaningful). `fp16`: run a float32 graph in fp16 on the HTP. `fold_constants` False: ONNX
    Runtime's constant folding is off, so nodes that compute from constants only (a Cast of an fp16
    weight) reach the QNN graph as nodes, their constants as given."""
    ort, devices = _devices()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if not fold_constants:
        options.add_session_config_entry("optimization.disable_specified_optimizers", "ConstantFolding")
    if context_out is not None:
        options.add_session_config_entry("ep.context_enable", "1")
        options.add_session_config_entry("ep.context_file_path", str(context_out))
        options.add_session_config_entry("ep.context_embed_mode", "0")
    provider = {"backend_type": "htp", "enable_htp_fp16_precision": "1" if fp16 else "0"}
    if soc_model is not None:
        provider["soc_model"] = str(soc_model)
    if htp_arch is not None:
        provider["htp_arch"] = str(htp_arch)
    if dlc_dir is not None:
        provider.update(dump_qnn_ir_dlc="1", dump_qnn_ir_dlc_dir=str(dlc_dir))
    options.add_provider_for_devices(devices, provider)
    # The simulator logs "Failed to create HTP power config id" natively on every session; errors
    # that matter come back as the exception.
    with native_output_silenced():
        return ort.InferenceSession(str(model), options)
