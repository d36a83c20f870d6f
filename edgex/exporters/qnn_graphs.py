"""The ONNX graphs QNN artifacts are compiled from (fp32, or quantized to static QDQ), made once per
component and kept for the next caller."""

from __future__ import annotations

import atexit
import hashlib
import itertools
import json
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import TYPE_CHECKING

from ..isolation import run_forked_for
from .onnx import OnnxExporter
from .qnn_htp import for_the_htp
from .qnn_quantize import SCHEMES, quantize_qdq

if TYPE_CHECKING:
    from ..component import Component


class Graphs:
    """The ONNX graph a QNN artifact is compiled from: the component's fp32 graph with its constant
    pads written as concatenations and short rows' convolution padding as matrix products
    (`qnn_htp.for_the_htp`; fp16 artifacts), or that graph quantized to
    static QDQ, made once and kept for the next caller.

    One job needs it up to three times (the export compiles it, the scheme reference runs the QDQ
    graph, the `.dlc`'s stored-tensor check reads its weights), and a sweep's next job (the same
    component in another scheme) needs the same fp32 graph again. Profiled on the tiny 15-step
    predictor frame (fp16, 2 shared cores): its ONNX export took 166 s (torch.export's tracing and
    decompositions of the unrolled loop, then onnxscript's rewrites), the HTP compile 29 s, the
    `.dlc` 5 s, a simulated run 5 s: making that graph again was most of the job.

    The fp32 graph is kept by content (`_float_key`: edgex's source, the tool versions, the
    component's name, specs and every parameter and buffer byte), as ONNX export is deterministic
    (same bytes on a rebuild). QDQ graphs depend also on the calibration sets, which the recipe
    draws from its seeded eager pipeline, so they are kept for the same component object only;
    within one export the scheme reference is then the compiled graph by construction, and `edgex
    verify` (a new process) makes it again and checks its digest against the binary's record. One
    fp32 graph is kept at a time, in a private temporary folder.

    The folder is removed by `clear`, at exit in the process that made it (`atexit`), and with the
    job's temporary folder in a forked job (`edgex.isolation.run_forked`), whose `os._exit` runs
    no `atexit`. A forked child inherits this object: it may read the parent's graphs, but its
    `clear` only forgets a folder it did not make, which the parent still points to.

    Each graph is made in a child forked for it (`edgex.isolation.run_forked_for`), into this
    object's folder: torch's export and onnxscript's rewrites leave memory behind in the process
    that runs them (a 0.6b talker's job held 1.1 GB of its own for the rest of the job, beside its
    lowering and parity runs), and the caller needs only the file."""

    def __init__(self):
        self._key, self._folder, self._maker, self._owner, self._made = None, None, None, None, {}

    def get(self, component: Component, precision: str, calibration_size: int | None) -> tuple[Path, dict]:
        """(graph, quantization details; {} for fp16), read-only for callers."""
        if self._owner is None or self._owner() is not component:
            key = _float_key(component)
            if key != self._key:
                self.clear()
                self._key, self._folder, self._maker = key, Path(tempfile.mkdtemp(prefix="edgex-qnn-graphs-")), os.getpid()
            self._owner, self._made = weakref.ref(component), {k: v for k, v in self._made.items() if k == ("float", None)}
        key = (precision, calibration_size or component.calibration_size) if precision in SCHEMES else ("float", None)
        if key not in self._made:
            try:
                graph = self._folder / f"{component.name}.onnx"
                if ("float", None) not in self._made:
                    run_forked_for(component, "the ONNX graph's process", _float_graph, component, graph)
                    self._made[("float", None)] = (graph, {})
                if key[1] is not None:
                    quantized = self._folder / f"{component.name}.{precision}.{key[1]}.qdq.onnx"
                    details = run_forked_for(component, "the QDQ graph's process", quantize_qdq, graph, quantized, component,
                                             precision, key[1])
                    self._made[key] = (quantized, details)
            except BaseException:  # nothing half-made is kept
                self.clear()
                raise
        return self._made[key]

    def clear(self) -> None:
        if self._folder is not None and self._maker == os.getpid():
            shutil.rmtree(self._folder, ignore_errors=True)
        self._key, self._folder, self._maker, self._owner, self._made = None, None, None, None, {}


def _float_graph(component: Component, dest: Path) -> None:
    OnnxExporter().graph(component, "fp32", dest)
    for_the_htp(dest)


def _float_key(component: Component) -> str:
    """sha256 of what a component's fp32 ONNX graph is a function of (see `Graphs`): edgex's source,
    the tool versions, the component's specs, its modules' classes, every parameter and buffer."""
    import torch

    from ..artifacts.keys import edgex_source_sha256
    from ..toolchain import versions

    specs = [component.name, [s.to_json() for s in component.inputs], [s.to_json() for s in component.outputs]]
    # The graph is a function of its modules' code too: a module of a class defined outside edgex and
    # its pinned packages (a wrapper patched for a test) must not get another module's graph back.
    classes = [f"{name}:{type(m).__module__}.{type(m).__qualname__}" for name, m in component.module.named_modules()]
    digest = hashlib.sha256(json.dumps([edgex_source_sha256(), versions(), specs, classes], sort_keys=True, default=str).encode())
    for name, tensor in itertools.chain(component.module.named_parameters(), component.module.named_buffers()):
        digest.update(f"{name}\0{tuple(tensor.shape)}\0{tensor.dtype}\0".encode())
        digest.update(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


GRAPHS = Graphs()
atexit.register(GRAPHS.clear)
