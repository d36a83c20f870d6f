"""Quiet the toolchains' import-time chatter so edgex's own output (and --json) stays readable."""

from __future__ import annotations

import logging
import os
import warnings


def quiet_libraries() -> None:
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import torch  # noqa: F401  (torch configures its loggers on import; quiet them afterwards)

    for name in ("torch", "torch.utils._pytree", "torchao", "transformers", "onnxscript", "executorch", "torch.onnx"):
        logging.getLogger(name).setLevel(logging.ERROR)
