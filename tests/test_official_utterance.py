"""The official utterance: a small CustomVoice checkpoint built with the official classes (published
config, widths and depths shrunk), exported to ONNX fp32 by edgex, and `edgex pipeline` running the
runner over those artifacts against the official `generate()`, greedy, until EOS.

The checkpoint's EOS row is set so the official utterance stops after `STOP` frames (`official.stop_at`):
the runner must make the same codes and stop at the same frame. A runner that leaves the language row
out of the CustomVoice prefix (what made other toolchains' Qwen3-TTS apps unintelligible) fails. Sampled
(the official defaults), both sides drawing from shared draws, fp32 artifacts make every official code:
a step graph whose distribution is sharpened (the same arg max) passes greedy and fails sampled."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from conftest import built_once, cli_here

pytestmark = pytest.mark.xdist_group("official_utterance")  # the module fixture: built on one worker, never waited for

STOP = 10  # frames of the official utterance
COMPONENTS = ("talker_prefill", "talker_decode", "code_predictor_step", "code2latent", "latent2wav")
PLACE = "talker=onnx:fp32,code_predictor_step=onnx:fp32,decoder=onnx:fp32"
FRAMES = 16  # the most frames either side may make (the utterance stops at STOP)


@pytest.fixture(scope="module")
def custom_voice():
    """The CustomVoice checkpoint and its export, built once per run."""

    def make(root: Path) -> None:
        from edgex.recipes.qwen3_tts import official, utterance

        model = official.build("custom_voice", seed=0)
        request = utterance.default_request(model.model.config.to_dict(), seed=0)
        official.stop_at(model, request, STOP)
        checkpoint = official.write_checkpoint(model, root / "checkpoint")
        components = [arg for c in COMPONENTS for arg in ("--component", c)]
        proc = cli_here("export", "qwen3-tts", "--checkpoint", str(checkpoint), "--target", "cpu", "--out", str(root / "out"),
                       *components, "--format", "onnx", "--precision", "fp32", "--placement", PLACE, "--jobs", "2")
        assert proc.returncode == 0, proc.stderr[-3000:]

    return built_once("official-utterance", make) / "out" / "qwen3-tts" / "cpu"


def test_the_runner_over_onnx_fp32_artifacts_speaks_the_official_utterance(custom_voice):
    from edgex.in_situ import run_pipeline

    report = run_pipeline([custom_voice], PLACE.split(","), frames=FRAMES, stream_frames=FRAMES)
    official = report["official_utterance"]
    assert official["variant"] == "custom_voice" and official["speaker"] and official["language"] == "english"
    assert official["codec_prefix"] == [2154, 2156, 2050, 2157]  # think, think_bos, english, think_eos
    assert official["official_frames"] == official["runner_frames"] == official["frames_compared"] == STOP
    assert official["official_stopped"] and official["runner_stopped"]
    assert official["codes_equal"] and official["first_difference"] is None
    assert float(official["wav_db"]) > 60  # strict JSON: an exact figure is the string "inf"
    sampled = report["sampled_utterance"]  # fp32, the step graph: every drawn code the official one
    assert sampled["gated"] and sampled["predictor_sampling"] and sampled["codes_equal"], sampled
    assert sampled["frames_compared"] == sampled["official_frames"] == sampled["runner_frames"] > 2, sampled
    assert report["verdict"] == "pass"


def test_a_runner_without_the_language_row_fails_the_pipeline(custom_voice, tmp_path, monkeypatch):
    from edgex.in_situ import run_pipeline
    from edgex.recipes.qwen3_tts import runner

    folder = Path(shutil.copytree(custom_voice, tmp_path / "cpu"))
    original = runner.codec_prefix
    monkeypatch.setattr(runner, "codec_prefix",
                        lambda request, vocab: [i for i in original(request, vocab) if i not in vocab.languages.values()])
    report = run_pipeline([folder], PLACE.split(","), frames=FRAMES, stream_frames=FRAMES)
    official = report["official_utterance"]
    assert official["codec_prefix"] == [2154, 2156, 2157]
    assert not official["codes_equal"] and not official["first_difference"]["tie"]
    assert report["verdict"] == "fail" and any(f.startswith("official utterance: frame") for f in report["failures"])


def test_a_decoder_that_adds_noise_fails_the_official_waveform(custom_voice, tmp_path, monkeypatch):
    from edgex.in_situ import run_pipeline
    from edgex.recipes.qwen3_tts import utterance

    folder = Path(shutil.copytree(custom_voice, tmp_path / "cpu"))
    faithful = utterance.streaming_decoder

    def noisy(stages):
        decoder = faithful(stages)
        rng = np.random.default_rng(0)

        def decode(codes):
            wav = decoder(codes)
            return wav + 0.1 * np.sqrt(np.mean(wav**2)) * rng.standard_normal(wav.shape).astype(np.float32)

        return decode

    monkeypatch.setattr(utterance, "streaming_decoder", noisy)
    report = run_pipeline([folder], PLACE.split(","), frames=FRAMES, stream_frames=FRAMES)
    official = report["official_utterance"]
    assert official["codes_equal"] and 15 < official["wav_db"] < 25
    assert any(f.startswith("official utterance: the waveform") for f in report["failures"])


def _stages(folder):
    """The pipeline's stages over the fixture's artifacts, as `edgex pipeline` composes them."""
    from edgex.in_situ import _choose, _stage
    from edgex.recipes import RECIPES
    from edgex.recipes.qwen3_tts.in_situ import COMPONENTS, _predictor
    from edgex.verify import find_manifest, load_manifest

    recipe = RECIPES.get("qwen3-tts")
    manifest = load_manifest(find_manifest(folder))
    chosen = _choose([(folder, manifest)], recipe.facts, list(COMPONENTS), PLACE.split(","))
    stages = {n: _stage(n, e, root, 2, {}) for n, (root, e) in chosen.items()}
    loaded = recipe.load(None, Path(manifest["source"]["checkpoint"]), 0)
    stages["code_predictor"] = _predictor(stages, loaded.models.talker)
    return loaded, stages


def test_sampled_utterances_drawing_the_same_noise_are_equal(custom_voice, monkeypatch):
    """Sampled (the official defaults), both sides drawing from one seeded generator: the runner over
    the artifacts makes the official codes; official draws from other noise do not."""
    from edgex.recipes.qwen3_tts import utterance

    loaded, stages = _stages(custom_voice)
    same = utterance.sampled_compare(loaded, stages, FRAMES, seed=5)
    assert same["codes_equal"] and same["frames_compared"] == same["official_frames"] > 4, same
    monkeypatch.setattr(utterance.SharedDraws, "__init__", lambda self, seed: setattr(self, "rng", np.random.default_rng(seed + 1)))
    other = utterance.sampled_compare(loaded, stages, FRAMES, seed=5)
    assert not other["codes_equal"] and other["first_difference"] is not None


class _Sharpened:
    """A step graph that draws from another distribution: its logits x 1.5 (a temperature baked in),
    the same arg max, so greedy codes are unchanged."""

    def __init__(self, stage):
        self.stage, self.entry = stage, stage.entry

    def __call__(self, inputs):
        logits, key, value = self.stage(inputs)
        return [logits * 1.5, key, value]


def test_a_step_graph_that_draws_from_another_distribution_fails_the_sampled_utterance(custom_voice):
    """The pipeline's sampled comparison (fp32 artifacts: gated, every drawn code equal): the faithful
    step graph passes; a sharpened one keeps the greedy utterance official and fails the sampled one."""
    from edgex.recipes.qwen3_tts import utterance

    loaded, stages = _stages(custom_voice)
    faithful = utterance.sampled(loaded, stages, FRAMES)
    assert faithful["gated"] and faithful["predictor_sampling"] and not faithful["failures"], faithful
    assert faithful["codes_equal"] and faithful["frames_compared"] == faithful["official_frames"] > 2, faithful
    stages["code_predictor"].step = _Sharpened(stages["code_predictor"].step)
    assert utterance.compare(loaded, stages, FRAMES, 0.0)["codes_equal"]  # greedy cannot tell
    broken = utterance.sampled(loaded, stages, FRAMES)
    assert not broken["codes_equal"] and broken["first_difference"]["codebook"] > 0, broken
    assert broken["failures"] and broken["failures"][0].startswith("sampled utterance: frame"), broken
    step = stages["code_predictor"].step  # the same graph declared fp16: the difference is informational
    step.entry = {**step.entry, "precision": "fp16"}
    lower = utterance.sampled(loaded, stages, FRAMES)
    assert not lower["gated"] and not lower["codes_equal"] and not lower["failures"], lower
    assert lower["note"].startswith("informational, not gated: code_predictor fp16"), lower
