"""Verdicts nobody can misread, on toy components (no export): a NaN or inf is a failure with its
own reason, wherever it appears; the end-to-end figure is gated beside the scheme and lowering
figures; the report names the gate that decided."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from noisy_scheme import NoisyScheme, noisy
from edgex.component import LOGITS, Component, TensorSpec
from edgex.exporters.base import StoredTensor
from edgex.parity import metrics
from edgex.parity.check import measure
from edgex.parity.runtimes.base import Session
from edgex.parity.scheme import measure_split
from edgex.parity.tensors import row_snr_db, tensor_parity
from edgex.render import gate as gate_text
from edgex.status import status

SHAPE = (4, 256)


def _component(samples: int = 3, reference=None) -> Component:
    gen = torch.Generator().manual_seed(0)
    inputs = {f"s{i}": (torch.randn(SHAPE, generator=gen),) for i in range(samples)}
    return Component("toy", "talker", nn.Identity(), [TensorSpec("x", SHAPE, "float32")],
                     [TensorSpec("y", SHAPE, "float32"), TensorSpec("z", SHAPE, "float32")],
                     reference or (lambda x: (2 * x, x + 1)), inputs)


class _Run(Session):
    """Runs `fn(call index, inputs)`."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def run(self, inputs):
        self.calls += 1
        return self.fn(self.calls - 1, inputs)


def _faithful(_call, inputs):
    return [2 * inputs[0], inputs[0] + 1]


def test_a_nan_in_one_output_of_one_sample_fails_with_that_reason():
    def nan_in_z_of_sample_2(call, inputs):
        y, z = _faithful(call, inputs)
        if call == 2:
            z = z.copy()
            z[1, 7] = np.nan
        return [y, z]

    report = measure(_component(), _Run(nan_in_z_of_sample_2), "toy", "float32", 60.0)
    assert report.verdict == "fail" and report.min_snr_db == -math.inf
    assert report.failures[0] == "s2: z: 1 NaN / inf value(s) of 1024 where the reference is finite", report.failures
    assert report.gate == {"figure": "end-to-end", "check": "non-finite", "value": 1, "limit": 0, "min_snr_db": -math.inf,
                           "threshold_db": 60.0}
    assert measure(_component(), _Run(_faithful), "toy", "float32", 60.0).verdict == "pass"


def test_an_inf_in_a_reference_fails_whatever_the_order_of_figures():
    """An inf in the reference's second output of the second sample: its SNR came out NaN, and
    Python's min over [inf, ..., nan, ...] skipped it."""
    def reference(x):
        y, z = 2 * x, x + 1
        if float(x[0, 0]) == first_of_s1:
            z = z.clone()
            z[0, 0] = math.inf
        return y, z

    component = _component(reference=reference)
    first_of_s1 = float(component.samples["s1"][0][0, 0])
    report = measure(component, _Run(_faithful), "toy", "float32", 60.0)
    assert report.verdict == "fail" and report.min_snr_db == -math.inf, report.min_snr_db
    assert report.failures[0] == "s1: z: the reference holds 1 NaN / inf value(s) of 1024", report.failures


def test_figures_are_never_nan():
    ref = np.ones(4)
    assert metrics.snr_db(np.array([1.0, math.inf, 1, 1]), np.array([1.0, math.inf, 1, 1])) == -math.inf
    assert metrics.psnr_db(np.array([1.0, math.nan, 1, 1]), ref) == -math.inf
    assert metrics.lowest([math.inf, 20.0, math.nan]) == -math.inf and metrics.lowest([]) is None
    rows = row_snr_db(np.ones((3, 2)), np.array([[1, 1], [1, math.nan], [1, 1.5]]))
    assert rows[0] == math.inf and rows[1] == -math.inf and np.isfinite(rows[2])


class _Stores:
    """An exporter whose file stores `tables` (as `StoredTensor`s)."""

    def __init__(self, stored: dict[str, StoredTensor]):
        self.stored = stored

    def stored_tensors(self, component, files, precision, **options):
        return self.stored


def test_a_nan_row_in_a_stored_table_fails_with_its_row():
    table = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)
    stored = table.copy()
    stored[3] = np.nan
    block = tensor_parity(_Stores({"token_embd.weight": StoredTensor("table", stored, table, rows=True)}), None, [], 30.0, "f16")
    assert block["verdict"] == "fail" and block["min_snr_db"] == -math.inf
    assert block["failure"] == "stored tensor token_embd.weight (row 3) holds NaN / inf (8 value(s) in the tensor)"
    assert block["tensors"]["token_embd.weight"]["rows_below_gate"] == 1
    good = tensor_parity(_Stores({"token_embd.weight": StoredTensor("table", table, table, rows=True)}), None, [], 30.0, "f16")
    assert good["verdict"] == "pass"




def test_scheme_and_lowering_each_passing_do_not_pass_an_artifact_under_the_end_to_end_floor():
    """Scheme 10.5 dB against a 10 dB gate, lowering 12.5 dB against 12 dB: their errors add up to
    ~8.4 dB end to end, under the precision's 10 dB. Each figure alone passes; the artifact fails,
    and the report says the end-to-end gate decided."""
    component = _component()
    scheme = NoisyScheme(component, 10.5)
    session = _Run(lambda _call, inputs: noisy([t.numpy() for t in scheme(tuple(torch.from_numpy(x) for x in inputs))],
                                                12.5, seed=2))
    report = measure_split(component, session, "toy", "float32", 10.0, 12.0, scheme)
    assert report.scheme["verdict"] == "pass" and report.lowering["verdict"] == "pass"
    assert abs(report.scheme["min_snr_db"] - 10.5) < 0.01 and abs(report.lowering["min_snr_db"] - 12.5) < 0.01
    assert 7.5 < report.min_snr_db < 9.5, report.min_snr_db
    assert report.verdict == "fail" and report.failures[0].startswith("end-to-end: min SNR"), report.failures
    assert report.gate["figure"] == "end-to-end" and report.gate["threshold_db"] == 10.0
    # the same figures with a floor under them pass, and name the gate they passed closest to
    session.calls = 0
    passing = measure_split(component, session, "toy", "float32", 7.0, 12.0, scheme)
    assert passing.verdict == "pass" and passing.gate["figure"] == "lowering", passing.gate


class _FailedFloatGraph(NoisyScheme):
    """A scheme reference whose own check failed: the fp32 graph it was quantized from scored 15.9 dB
    against eager (a QDQ graph made from a broken float graph inherits the bug, so its lowering
    figure passes)."""

    failures = ["the fp32 graph the QDQ graph was made from: min SNR 15.9 dB < 60.0 dB"]

    def to_json(self):
        return {"source": self.label, "float_graph": {"min_snr_db": 15.9, "threshold_db": 60.0, "verdict": "fail"}}


def test_a_failed_reference_check_is_named_as_the_gate_that_decided():
    """End-to-end, scheme and lowering figures all pass; the fp32-graph check failed the artifact,
    and the report names that check (not the passing figure closest to its gate)."""
    component = _component()
    scheme = _FailedFloatGraph(component, 40.0)
    session = _Run(lambda _call, inputs: [t.numpy() for t in scheme(tuple(torch.from_numpy(x) for x in inputs))])
    report = measure_split(component, session, "toy", "float32", 10.0, 12.0, scheme)
    assert report.scheme["verdict"] == "pass" and report.lowering["verdict"] == "pass"
    assert report.verdict == "fail" and report.failures == [f"reference: {scheme.failures[0]}"], report.failures
    assert report.gate == {"figure": "fp32 graph", "check": "SNR", "value": 15.9, "limit": 60.0, "min_snr_db": 15.9,
                           "threshold_db": 60.0}, report.gate


def _flipped_logits():
    """Logits whose top-1 the artifact moves to the runner-up, far beyond the tie margin, with
    an SNR that passes every gate: a scheme reference equal to eager, so the end-to-end and
    lowering figures hold the same flip."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(1, 64, generator=gen)
    logits[0, 0], logits[0, 1] = 4.0, 3.0
    out = logits.clone()
    out[0, 1] = 4.1
    component = Component("prefill", "llm", nn.Identity(), [TensorSpec("x", (1, 1), "float32")],
                          [TensorSpec("logits", (1, 64), "float32", LOGITS)], lambda x: (logits.clone(),), {"s": (torch.zeros(1, 1),)})

    class Eager:
        label = "eager"

        def __call__(self, inputs, forced=None):
            return (logits.clone(),)

        def to_json(self):
            return {"source": self.label}

    return component, Eager(), _Run(lambda _call, inputs: [out.numpy()])


def test_a_token_flip_that_failed_an_entry_is_its_deciding_gate_not_a_passing_snr():
    """The artifact flips the top-1 token beyond the tie margin, end to end and against its scheme
    reference, while every SNR passes (about 19 dB against 10 and 12). The check that failed it, the
    end-to-end token flip and its size in tie margins, decides; not the lowering SNR, which passed
    closest to its gate."""
    component, scheme, session = _flipped_logits()
    report = measure_split(component, session, "toy", "float32", 10.0, 12.0, scheme)
    assert report.verdict == "fail" and report.failures[0].startswith("end-to-end: s: logits position 0"), report.failures
    assert report.min_snr_db > 15.0 and report.lowering["min_snr_db"] > 15.0
    gate = report.gate
    assert (gate["figure"], gate["check"], gate["limit"]) == ("end-to-end", "token flip", 1.0), gate
    (flip, *_) = [d for d in report.divergences if not d["tie"]]
    assert gate["value"] == pytest.approx(flip["margin"] / flip["tie_margin"]) and gate["value"] > 1.0
    assert gate_text({"parity": report.to_json()}).startswith("e2e token flip ")


def test_a_failed_stored_tensor_check_is_the_entry_gate_where_the_parity_run_passed():
    from edgex.parity.check import entry_gate

    parity = {"verdict": "pass", "gate": {"figure": "lowering", "check": "SNR", "value": 40.0, "limit": 30.0,
                                          "min_snr_db": 40.0, "threshold_db": 30.0}}
    tensors = {"verdict": "fail", "min_snr_db": 12.0, "threshold_db": 30.0, "failure": "stored tensor t (row 3) ..."}
    assert entry_gate(parity, tensors)["figure"] == "stored tensors" and entry_gate(parity, tensors)["value"] == 12.0
    quantized = {"verdict": "fail", "min_agreement_db": 3.0, "threshold_db": 40.0, "failures": ["w: ..."]}
    assert entry_gate(parity, None, quantized)["figure"] == "stored quantized tensors"
    assert entry_gate(parity, {"verdict": "pass"}, {"verdict": "pass"}) == parity["gate"], "a pass: the thinnest margin"
    failed = {"verdict": "fail", "gate": {**parity["gate"], "figure": "end-to-end", "check": "token flip"}}
    assert entry_gate(failed, tensors) == failed["gate"], "the parity run's failure comes first"


def test_an_empty_set_of_entries_is_never_a_pass():
    assert status([]) == "incomplete" and status([], ["sidecar"]) == "incomplete"
    assert status([{"verdict": "pass", "component": "c", "format": "onnx", "precision": "fp32"}]) == "pass"
