"""Waveforms whose phase is free are gated by a phase-insensitive spectral figure
(`metrics.spectral_db`), their SNR recorded beside it: the metric on synthetic voices, and MiniCPM-o's
HiFT vocoder (the official `HiFTGenerator`, built at sizes no preset uses) scored by
`parity.check.measure` against its eager reference, faithful and with a broken F0 predictor."""

import dataclasses
import math
from functools import partial

import numpy as np
import pytest
import torch

from edgex.component import SIGNAL, Component, TensorSpec
from edgex.parity.check import measure
from edgex.parity.metrics import snr_db, spectral_db
from edgex.parity.runtimes.base import Session
from edgex.recipes import RECIPES
from edgex.recipes.minicpm_o import hift as hift_graphs
from edgex.recipes.minicpm_o.models import _speech_like_hift, build_hift, randomize
from edgex.recipes.minicpm_o.stepaudio2_import import stepaudio2_modules

RATE = 24000
GATE_DB = 60.0  # fp32, the precision HiFT is placed in
ROTATED_GATE_DB = 20.0
WAVEFORM_CORRELATION = 0.5  # `edgex.parity.gates.WAVEFORM_CORRELATION` (a test checks they agree)


def _voice(phase: np.ndarray, offsets=None, harmonics: int = 8) -> np.ndarray:
    offsets = np.zeros(harmonics) if offsets is None else offsets
    return 0.3 * sum(np.sin(k * phase + offsets[k - 1]) / k for k in range(1, harmonics + 1))


def make_voice():
    t = np.arange(RATE) / RATE
    phase = 2 * np.pi * np.cumsum(180 + 20 * np.sin(2 * np.pi * 1.5 * t)) / RATE  # vibrato around 180 Hz
    return phase, _voice(phase)


@pytest.fixture(scope="module")
def voice():
    return make_voice()


def test_a_phase_change_scores_high_where_the_waveform_snr_is_low(voice):
    phase, ref = voice
    rng = np.random.default_rng(0)
    changed = {
        "random phase per harmonic": _voice(phase, rng.uniform(0, 2 * np.pi, 8)),
        "quadrature": _voice(phase, np.full(8, np.pi / 2)),
        "phase drift 0.5 rad": _voice(phase + np.linspace(0, 0.5, phase.size)),
    }
    for name, out in changed.items():
        assert spectral_db(ref, out) >= 25.0 and snr_db(ref, out) <= 5.0, name


def test_a_broken_signals_score_low(voice):
    phase, ref = voice
    rng = np.random.default_rng(1)
    freqs = np.fft.rfftfreq(ref.size, 1 / RATE)
    broken = {
        "pitch 6 % high": _voice(phase * 1.06),
        "band 300-700 Hz zeroed": np.fft.irfft(np.fft.rfft(ref) * ((freqs < 300) | (freqs > 700)), ref.size),
        "noise at 10 dB SNR": ref + 10 ** -0.5 * ref.std() * rng.standard_normal(ref.size),
        "two harmonics": _voice(phase, harmonics=2),
    }
    for name, out in broken.items():
        assert spectral_db(ref, out) < 15.0, name


def test_a_additive_error_scores_near_its_snr_and_nonfinite_is_minus_inf(voice):
    _, ref = voice
    rng = np.random.default_rng(2)
    for level in (30.0, 60.0, 80.0):  # white noise: the spectral figure tracks the SNR, a few dB above
        out = ref + 10 ** (-level / 20) * ref.std() * rng.standard_normal(ref.size)
        assert abs(spectral_db(ref, out) - snr_db(ref, out)) < 6.0, level
    assert spectral_db(ref, ref.copy()) == math.inf
    for bad in (np.nan, np.inf):
        out = ref.copy()
        out[100] = bad
        assert spectral_db(ref, out) == -math.inf and spectral_db(out, ref) == -math.inf
    out = ref + 1e-3
    assert spectral_db(ref, out) == spectral_db(ref.copy(), out.copy())  # deterministic


class _ScaledF0(hift_graphs.HiFT):
    """HiFT with its F0 predictor's output scaled: a broken F0 at 0.8 or 0."""

    def __init__(self, hift, frames, scale):
        super().__init__(hift, frames)
        self.scale = scale

    def _f0(self, mel):
        return super()._f0(mel) * self.scale


class _Files(Session):
    """An artifact's outputs stored in a file: every run reads the same bytes back."""

    def __init__(self, path, by_sample):
        np.savez(path, **{f"{s}/{i}": o for s, outs in by_sample.items() for i, o in enumerate(outs)})
        self.path, self.samples, self.calls = path, list(by_sample), 0

    def run(self, inputs):
        sample = self.samples[self.calls % len(self.samples)]
        self.calls += 1
        with np.load(self.path) as stored:
            return [stored[f"{sample}/{i}"] for i in range(2)]


FRAMES = 20


def make_vocoder():
    """The official HiFTGenerator at 24 / 16 channels (no preset's), seeded, and a HiFT component whose
    reference is the official forward."""
    hift = build_hift({"base_channels": 24, "f0_channels": 16})
    randomize(hift, 5)
    _speech_like_hift(hift)
    layers = stepaudio2_modules().hifigan_layers
    upsample = hift_graphs.HiFT(hift, 1).upsample
    samples = {}
    for i, name in enumerate(("first_chunk", "cached_chunk")):
        gen = torch.Generator().manual_seed(10 + i)
        mel = torch.randn(1, 80, FRAMES, generator=gen)
        noise = torch.randn(1, FRAMES * upsample, hift_graphs.HARMONICS, generator=gen)
        cache = 0.1 * torch.randn(1, 1, hift_graphs.CACHE_FRAMES * upsample, generator=gen)
        samples[name] = (mel, noise, cache, torch.tensor([float(i)]))

    reference = partial(hift_graphs.hift_reference, hift, layers)  # the official forward, draws fixed
    first = samples["first_chunk"]
    wav, source = reference(*first)
    component = Component(
        "hift", "decoder", hift_graphs.HiFT(hift, FRAMES).eval(),
        [TensorSpec(n, tuple(t.shape), "float32") for n, t in zip(("mel", "noise", "cache_source", "use_cache"), first)],
        [TensorSpec("wav", tuple(wav.shape), "float32", SIGNAL), TensorSpec("source", tuple(source.shape), "float32", SIGNAL)],
        reference, samples, spectral=RECIPES.facts("minicpm-o").spectral_outputs["hift"],
    )
    return hift, component


@pytest.fixture(scope="module")
def vocoder():
    return make_vocoder()


def _artifact(component, module, path):
    with torch.no_grad():
        outputs = {s: [t.numpy() for t in module(*inputs)] for s, inputs in component.samples.items()}
    return _Files(path, outputs)


def test_b_recipe_declares_hift_wav_and_source_spectral():
    facts = RECIPES.facts("minicpm-o")
    assert facts.spectral_outputs == {"hift": ("wav", "source"), "hift_stream": ("wav",)} and facts.components["hift"] == "decoder"


def test_b_faithful_hift_passes_on_the_spectral_figure_with_identical_verdicts(vocoder, tmp_path):
    hift, component = vocoder
    files = _artifact(component, hift_graphs.HiFT(hift, FRAMES), tmp_path / "faithful.npz")
    reports = [measure(component, files, "stored", "float32", GATE_DB) for _ in range(2)]
    for report in reports:
        assert report.verdict == "pass", report.failures
        scores = [s[output] for s in report.samples.values() for output in ("wav", "source")]
        assert min(s["spectral_db"] for s in scores) >= GATE_DB
        assert report.min_waveform_snr_db == min(s["snr_db"] for s in scores)
    first, again = (r.to_json() for r in reports)
    assert {k: v for k, v in first.items() if k != "seconds"} == {k: v for k, v in again.items() if k != "seconds"}


@pytest.mark.parametrize("scale", [0.8, 0.0])
def test_b_hift_with_a_broken_f0_predictor_fails_on_the_spectral_figure(vocoder, tmp_path, scale):
    hift, component = vocoder
    files = _artifact(component, _ScaledF0(hift, FRAMES, scale), tmp_path / "broken.npz")
    reports = [measure(component, files, "stored", "float32", GATE_DB) for _ in range(2)]
    assert [r.verdict for r in reports] == ["fail", "fail"]
    for report in reports:
        wav = [s["wav"]["spectral_db"] for s in report.samples.values()]
        assert max(wav) < 20.0 and report.min_snr_db == min(wav + [s["source"]["spectral_db"] for s in report.samples.values()])
        assert report.failures[0].startswith("min SNR / spectral figure")


def _turned(signal, degrees):
    """Every frequency's phase turned by `degrees` (90: a Hilbert rotation; 180: the waveform
    negated): the same magnitude spectrum, a waveform correlating at cos(degrees) with the original."""
    turn = np.exp(1j * np.deg2rad(degrees))
    return torch.fft.irfft(torch.fft.rfft(signal.double()) * complex(turn), signal.shape[-1]).float()


class _Rotated(hift_graphs.HiFT):
    """HiFT whose wav is turned in phase by `degrees`."""

    def __init__(self, hift, frames, degrees):
        super().__init__(hift, frames)
        self.degrees = degrees

    def forward(self, *inputs):
        wav, source = super().forward(*inputs)
        return _turned(wav, self.degrees), source


class _SourceChanged(hift_graphs.HiFT):
    """HiFT whose wav is faithful and whose `source` output alone is the sine source of an F0 `scale`
    times the predicted one (the cached head kept as the graph keeps it)."""

    def __init__(self, hift, frames, scale):
        super().__init__(hift, frames)
        self.scale = scale

    def forward(self, mel, noise, cache_source, use_cache):
        wav, _ = super().forward(mel, noise, cache_source, use_cache)
        source = self._source(self._f0(mel) * self.scale, noise)
        keep = cache_source.shape[2]
        head = use_cache * cache_source + (1 - use_cache) * source[:, :, :keep]
        return wav, torch.cat((head, source[:, :, keep:]), dim=2)


def test_b_the_spectral_figure_decides_a_declared_output_and_the_snr_is_recorded(vocoder, tmp_path):
    """A wav turned by 45 degrees in phase: its waveform SNR (2.3 dB) fails a 20 dB gate, its
    spectral figure passes it, and its correlation with the reference (0.71) passes the floor."""
    hift, component = vocoder
    files = _artifact(component, _Rotated(hift, FRAMES, 45), tmp_path / "rotated.npz")
    report = measure(component, files, "stored", "float32", ROTATED_GATE_DB)
    assert report.verdict == "pass", report.failures
    assert report.min_waveform_snr_db < 5.0 < ROTATED_GATE_DB <= min(s["wav"]["spectral_db"] for s in report.samples.values())
    assert WAVEFORM_CORRELATION < report.min_waveform_correlation < 0.75
    undeclared = measure(dataclasses.replace(component, spectral=()), files, "stored", "float32", ROTATED_GATE_DB)
    assert undeclared.verdict == "fail" and undeclared.min_waveform_snr_db is None


@pytest.mark.parametrize("degrees", [90, 180])
def test_b_a_negated_or_quarter_turned_wav_fails_on_its_correlation_where_its_spectrum_passes(vocoder, tmp_path, degrees):
    """The spectrum cannot see a sign flip or a quarter-period turn; the waveform's correlation with
    the reference (0 and -1) fails them, and that check is named as the one that decided."""
    from edgex.parity.gates import WAVEFORM_CORRELATION as floor

    assert floor == WAVEFORM_CORRELATION
    hift, component = vocoder
    files = _artifact(component, _Rotated(hift, FRAMES, degrees), tmp_path / f"turned{degrees}.npz")
    report = measure(component, files, "stored", "float32", ROTATED_GATE_DB)
    assert min(s["wav"]["spectral_db"] for s in report.samples.values()) >= ROTATED_GATE_DB
    assert report.verdict == "fail" and report.failures == [
        f"waveform correlation {report.min_waveform_correlation:.3f} with the reference below the {WAVEFORM_CORRELATION:g} "
        "floor (a sign flip or a shifted waveform)"]
    assert report.min_waveform_correlation == pytest.approx(np.cos(np.deg2rad(degrees)), abs=0.02)
    assert (report.gate["check"], report.gate["value"]) == ("waveform correlation", report.min_waveform_correlation)


def test_b_the_source_output_is_judged_by_its_spectrogram(vocoder, tmp_path):
    """`source` (the sine source the next call's STFT reads) is declared too. Its phase drifting by
    0.25 rad at the fundamental over the chunk (F0 0.05 % high) passes a 20 dB gate on its spectral
    figure where its SNR fails it; its pitch 20 % low fails; the wav is faithful in both."""
    hift, component = vocoder
    drift = _artifact(component, _SourceChanged(hift, FRAMES, 1.0005), tmp_path / "drift.npz")
    drifted = measure(component, drift, "stored", "float32", ROTATED_GATE_DB)
    assert drifted.verdict == "pass", drifted.failures
    assert min(s["source"]["snr_db"] for s in drifted.samples.values()) < 5.0 < ROTATED_GATE_DB <= drifted.min_snr_db
    assert measure(dataclasses.replace(component, spectral=("wav",)), drift, "stored", "float32",
                   ROTATED_GATE_DB).verdict == "fail"
    low = measure(component, _artifact(component, _SourceChanged(hift, FRAMES, 0.8), tmp_path / "low.npz"),
                  "stored", "float32", GATE_DB)
    assert low.verdict == "fail" and max(s["source"]["spectral_db"] for s in low.samples.values()) < 20.0
    assert min(s["wav"]["spectral_db"] for s in low.samples.values()) >= GATE_DB
