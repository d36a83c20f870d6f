"""Compile, profile and inference jobs on an AI Hub device, and parity from the device's outputs.

The artifact is compiled and run for the compute unit its placement names (`edgex.hub.artifacts`).
The inference job runs every sample of the component (the export example and the held-out ones) in
one dataset; its outputs, taken by the component's declared output names (never by position), are
scored by the same code as local parity, against the same eager reference, under the same gates: a
quantized or fp16 artifact gets the scheme / lowering split (`edgex.parity.scheme.measure_split`),
so a device build that moved the lowering fails the tight lowering gate even where its end-to-end
figure clears the scheme's policy gate. A sidecar (a QNN `.dlc`) is run on the device as itself and
held to the same split; it passes only by its own device run. Waiting is edgex's own wall-clock
loop (qai-hub's `wait` counts sleeps, not time, and polls every 10 s).
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..artifacts.files import file_record, move_into_place
from ..component import Component
from ..errors import EdgexError
from ..exporters.onnx import sliced_feed, sliced_inputs_of
from ..isolation import private_tempdir
from ..parity.check import ParityReport, measure, to_numpy
from ..parity.runtimes.base import Session
from ..parity.scheme import measure_split
from ..toolchain import require
from .artifacts import Submission, prepare
from .client import HubConnection, hub_errors

HUB_DIR = "hub"  # compiled device models downloaded from AI Hub, under the export folder


@dataclass
class DeviceRun:
    outputs: list[list[np.ndarray]]  # per sample, in the component's declared output order
    profile: dict
    jobs: dict = field(default_factory=dict)  # kind -> {"id", "url"}
    target_model: Path | None = None


def _poll_seconds(timeout_s: float) -> float:
    """Often enough that short timeouts are honoured, never more than AI Hub's own 10 s cadence."""
    return min(10.0, max(0.1, timeout_s / 100))


def wait(job, kind: str, conn: HubConnection) -> None:
    """Block until `job` finishes; a failed job or a timeout is a one-line EdgexError with its URL."""
    deadline = time.monotonic() + conn.timeout_s
    while True:
        with hub_errors(f"polling {kind} job {job.job_id}"):
            status = job.get_status()
        if status.finished:
            break
        if time.monotonic() >= deadline:
            raise EdgexError(f"AI Hub {kind} job {job.job_id} on {conn.device} did not finish within "
                             f"{conn.timeout_s:g} s (still {status.code}): {job.url}")
        time.sleep(_poll_seconds(conn.timeout_s))
    if not status.success:
        raise EdgexError(f"AI Hub {kind} job {job.job_id} failed on {conn.device}: {status.message or 'no reason given'} ({job.url})")


def _dataset(component: Component, sent: list[list[np.ndarray]], specs: dict | None, sliced: dict[str, int]) -> dict:
    """Inputs as AI Hub's dataset schema: ordered names -> one array per sample. `specs` are the
    compiled model's inputs (AI Hub may rename them or narrow int64 to int32 for the HTP); they are
    matched by position, as compiled graphs keep the input order. A stacked input the ONNX file
    takes per layer (`sliced`) is sent as its slices."""
    fed = [sliced_feed(dict(zip([s.name for s in component.inputs], arrays)), sliced) for arrays in sent]
    columns = [(name, [sample[name] for sample in fed]) for name in (fed[0] if fed else [])]
    if specs is not None and len(specs) != len(columns):
        raise EdgexError(f"AI Hub compiled {component.name} with {len(specs)} inputs, the component's file takes {len(columns)}")
    names = list(specs) if specs else [name for name, _ in columns]
    dtypes = [spec[1] for spec in specs.values()] if specs else [None] * len(names)
    return {name: [np.ascontiguousarray(a.astype(dtype) if dtype else a) for a in arrays]
            for name, dtype, (_, arrays) in zip(names, dtypes, columns)}


def run_on_device(conn: HubConnection, component: Component, submission: Submission, sent: list[list[np.ndarray]], download_to: Path) -> DeviceRun:
    """Upload (and compile), then profile and infer on the device; download outputs and the model."""
    hub = require("qai_hub", "--hub (Qualcomm AI Hub jobs)")
    client = conn.client()
    device = hub.Device(conn.device)
    name = f"edgex {component.name}"
    run = DeviceRun([], {})
    sliced = sliced_inputs_of(submission.graph) if submission.graph is not None else {}
    if submission.compile_options is not None:
        with hub_errors(f"submitting the compile job for {component.name}"):
            compile_job = client.submit_compile_job(str(submission.upload), device, name=name, options=submission.compile_options)
        run.jobs["compile"] = {"id": compile_job.job_id, "url": compile_job.url}
        wait(compile_job, "compile", conn)
        with hub_errors(f"fetching compile job {compile_job.job_id}"):
            model = compile_job.get_target_model()
            specs = compile_job.get_target_shapes()
            download_to.mkdir(parents=True, exist_ok=True)
            run.target_model = Path(compile_job.download_target_model(str(download_to)))
    else:
        with hub_errors(f"uploading {submission.upload.name}"):
            model = client.upload_model(str(submission.upload), name=name)
        specs = None
    with hub_errors(f"submitting the profile and inference jobs for {component.name}"):
        profile_job = client.submit_inference_job(model, device, inputs=None, name=name, options=submission.run_options, profile=True)
        inference_job = client.submit_inference_job(model, device, inputs=_dataset(component, sent, specs, sliced), name=name,
                                                    options=submission.run_options, profile=False)
    run.jobs["profile"] = {"id": profile_job.job_id, "url": profile_job.url}
    run.jobs["inference"] = {"id": inference_job.job_id, "url": inference_job.url}
    wait(profile_job, "profile", conn)
    wait(inference_job, "inference", conn)
    with hub_errors(f"downloading the results of jobs {profile_job.job_id}, {inference_job.job_id}"):
        run.profile = profile_job.download_profile()
        received = inference_job.download_output_data()
    declared = [spec.name for spec in component.outputs]
    if not received or any(name not in received for name in declared):
        raise EdgexError(f"AI Hub inference job {inference_job.job_id} returned outputs {', '.join(received or {}) or 'none'}; "
                         f"{component.name} declares {', '.join(declared)} (outputs are taken by name)")
    columns = [received[name] for name in declared]
    run.outputs = [[np.asarray(column[i]) for column in columns] for i in range(len(sent))]
    return run


class _Replay(Session):
    """Hands `measure` the device's outputs, sample by sample, after checking it asks for exactly
    the inputs that were sent to the device."""

    def __init__(self, sent: list[list[np.ndarray]], received: list[list[np.ndarray]]):
        self._sent, self._received, self._next = sent, received, 0

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        i, self._next = self._next, self._next + 1
        if i >= len(self._sent) or not all(np.array_equal(a, b) for a, b in zip(inputs, self._sent[i])):
            raise RuntimeError("device outputs replayed for inputs that were not sent to the device")
        return self._received[i]


def _summary(profile: dict) -> dict:
    execution = profile.get("execution_summary", {})
    micros = execution.get("estimated_inference_time")
    return {
        "latency_ms": micros / 1000.0 if isinstance(micros, (int, float)) and micros > 0 else None,
        "peak_memory_bytes": execution.get("estimated_inference_peak_memory"),
        "compute_units": dict(Counter(layer.get("compute_unit") for layer in profile.get("execution_detail", []))),
    }


def device_parity(conn: HubConnection, component: Component, files: list[Path], io_float_dtype: str, local: dict, root: Path,
                  compute_unit: str | None = None, scheme_reference=None, lowering_gate: float | None = None) -> dict:
    """The manifest's `device_parity` block for one artifact (method `device`, or `none` + reason),
    gated like the artifact's local parity block `local`, and with `scheme_reference` (the
    exporter's model of what the files compute) split into scheme and lowering figures, the
    lowering held to `lowering_gate`. Artifacts that failed locally stay home. `compute_unit`: where
    its placement runs it (`Placement.compute_unit`). The compiled model is placed under `root`/hub/
    and recorded relative to `root` (the export's staged output folder)."""
    runtime = f"qai-hub ({conn.device})"
    base = {"device": conn.device}
    gate = local["threshold_db"]
    if local["verdict"] == "fail":  # "unverified" goes: the device may be the only place it can run
        return base | ParityReport("none", runtime, reason=f"not submitted: local parity verdict is {local['verdict']}", threshold_db=gate).to_json()
    with tempfile.TemporaryDirectory(prefix=".hub-", dir=root) as work:
        submission = prepare(files, Path(work), compute_unit)
        if isinstance(submission, str):
            return base | ParityReport("none", runtime, reason=submission, threshold_db=gate).to_json()
        sent = [to_numpy(inputs, io_float_dtype) for inputs in component.samples.values()]
        # qai-hub leaves files in the temporary folder (an uploaded folder's zip, an empty file per
        # downloaded dataset): its calls get a private one, removed after them
        with private_tempdir():
            run = run_on_device(conn, component, submission, sent, Path(work) / "download")
        reference = scheme_reference() if scheme_reference is not None and lowering_gate is not None else None
        if reference is None:
            report = measure(component, _Replay(sent, run.outputs), runtime, io_float_dtype, gate, method="device")
        else:
            report = measure_split(component, _Replay(sent, run.outputs), runtime, io_float_dtype, gate, lowering_gate, reference,
                                   method="device")
        block = base | report.to_json() | _summary(run.profile) | {
            "submitted_as": submission.kind, "compute_unit": submission.compute_unit, "compile_options": submission.compile_options,
            "run_options": submission.run_options, "jobs": run.jobs}
        if run.target_model is not None:
            dest = root / HUB_DIR / files[0].name.removesuffix(files[0].suffix)
            block["target_model"] = file_record(move_into_place([run.target_model], dest)[0], root)
    return block
