"""MiniCPM-o's HiFT from a checkpoint at sizes no preset uses, built with the official classes and
written in the released layout: `edgex export` (CPU, ONNX fp32) then five `edgex verify` runs of the
same files give the same verdict, pass, decided by the spectral figure with the waveform SNR
recorded beside it (the figures themselves repeat: the samples are drawn from seeded generators in
every process, the official CFM noise buffer included); the same export whose graph alone has a broken F0 predictor (the reference is
the official `HiFTGenerator`, unchanged) fails export and verify."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from edgex.cli import app
from edgex.recipes.minicpm_o import hift as hift_graphs
from edgex.recipes.minicpm_o.models import build_from_preset
from edgex.recipes.minicpm_o.presets import MiniCPMOPreset, _flow, _tts
from test_minicpm_o import _write_checkpoint

pytestmark = pytest.mark.xdist_group("hift_verdicts")

GATE_DB = 60.0  # HiFT is placed in fp32 on cpu
# 48-wide one-layer head with 3 heads, 48-wide flow model with a one-block DiT of 2 x 24, HiFT with
# 24 base / 16 F0 channels: none of these is a preset's size.
ODD = MiniCPMOPreset("odd", _tts(48, 1, 3, 96), _flow(48, 2, 1, 1, 96, 1, 48, 2, 24),
                     dict(base_channels=24, f0_channels=16), "sizes no preset uses")
BROKEN_F0_SCALE = 0.8  # the graph's F0 predictor reads 20 % low: the pitch of every voiced frame


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return _write_checkpoint(tmp_path_factory.mktemp("odd-checkpoint"), build_from_preset(ODD, seed=7), preset=ODD)


def _export(checkpoint, out):
    result = CliRunner().invoke(app, ["export", "minicpm-o", "--checkpoint", str(checkpoint), "--target", "cpu",
                                      "-c", "hift", "-f", "onnx", "-p", "fp32", "--set", "frames=20", "--out", str(out), "--json"])
    (entry,) = json.loads(result.stdout)["artifacts"]
    return result, entry, out / "minicpm-o" / "cpu"


def _verify(folder):
    result = CliRunner().invoke(app, ["verify", str(folder), "--json"])
    (row,) = json.loads(result.stdout)["artifacts"]
    return result.exit_code, row


def test_faithful_hift_passes_on_the_spectral_figure_in_five_verifies(checkpoint, tmp_path):
    result, entry, folder = _export(checkpoint, tmp_path)
    assert result.exit_code == 0 and entry["verdict"] == "pass", result.output[-3000:]
    parity = entry["parity"]
    scores = [s[output] for s in parity["samples"].values() for output in ("wav", "source")]
    assert min(s["spectral_db"] for s in scores) >= GATE_DB
    assert parity["min_snr_db"] == min(s["spectral_db"] for s in scores)  # the SNRs are not in the gated minimum
    assert parity["min_waveform_snr_db"] == min(s["snr_db"] for s in scores)
    runs = [_verify(folder) for _ in range(5)]
    assert {(code, row["verdict"], row["files"], row["problem"]) for code, row in runs} == {(0, "pass", "ok", "")}
    # the same samples in every run (the official CFM noise buffer is drawn from a seeded generator),
    # so the same figures: the gated one, and the waveform SNR recorded beside it
    ((gated, waveform, gate),) = {(row["min_snr_db"], row["min_waveform_snr_db"], row["threshold_db"]) for _, row in runs}
    assert gate == GATE_DB <= gated and isinstance(waveform, float)
    assert abs(gated - parity["min_snr_db"]) < 0.1  # the export's own run (its runtime threads may differ)


def test_hift_with_a_broken_f0_predictor_in_its_graph_fails(checkpoint, tmp_path, monkeypatch):
    f0 = hift_graphs.HiFT._f0
    monkeypatch.setattr(hift_graphs.HiFT, "_f0", lambda self, mel: f0(self, mel) * BROKEN_F0_SCALE)
    result, entry, folder = _export(checkpoint, tmp_path)
    monkeypatch.undo()  # verify rebuilds the reference from the checkpoint: the official code, unchanged
    assert result.exit_code == 1 and entry["verdict"] == "fail"
    assert max(s["wav"]["spectral_db"] for s in entry["parity"]["samples"].values()) < 20.0
    assert entry["parity"]["failures"][0].startswith("min SNR / spectral figure")
    code, row = _verify(folder)
    assert code == 1 and row["files"] == "ok" and row["verdict"] == "fail" and row["min_snr_db"] < 20.0, row
