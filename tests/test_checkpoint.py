"""Loading a local Hugging Face-layout checkpoint (never a hub)."""

import json

import pytest
import torch
from safetensors.torch import save_file

from conftest import cli_here
from edgex.errors import EdgexError
from edgex.recipes.qwen3_tts.models import build_from_preset, load_checkpoint
from edgex.recipes.qwen3_tts.presets import get_preset

pytestmark = pytest.mark.xdist_group("checkpoint")  # its module fixture is built once


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny preset written the way the published checkpoints are laid out."""
    preset = get_preset("tiny")
    models = build_from_preset(preset, seed=3)
    root = tmp_path_factory.mktemp("ckpt")
    (root / "speech_tokenizer").mkdir()
    (root / "config.json").write_text(json.dumps({"talker_config": preset.talker, "tts_model_type": "base"}))
    (root / "speech_tokenizer" / "config.json").write_text(json.dumps({"decoder_config": preset.decoder}))
    save_file({f"talker.{k}": v.contiguous() for k, v in models.talker.state_dict().items()}, str(root / "model.safetensors"))
    save_file({f"decoder.{k}": v.contiguous() for k, v in models.decoder.state_dict().items()},
              str(root / "speech_tokenizer" / "model.safetensors"))
    return root, models


def test_checkpoint_loads_every_tensor(checkpoint):
    root, original = checkpoint
    loaded = load_checkpoint(root)
    for a, b in ((original.talker, loaded.talker), (original.decoder, loaded.decoder)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert loaded.source == {"checkpoint": str(root.resolve())}


def test_checkpoint_with_a_missing_tensor_is_refused(checkpoint, tmp_path):
    root, original = checkpoint
    broken = tmp_path / "broken"
    (broken / "speech_tokenizer").mkdir(parents=True)
    (broken / "config.json").write_text((root / "config.json").read_text())
    (broken / "speech_tokenizer" / "config.json").write_text((root / "speech_tokenizer" / "config.json").read_text())
    state = {f"talker.{k}": v.contiguous() for k, v in original.talker.state_dict().items() if "codec_head" not in k}
    save_file(state, str(broken / "model.safetensors"))
    (broken / "speech_tokenizer" / "model.safetensors").write_bytes((root / "speech_tokenizer" / "model.safetensors").read_bytes())
    with pytest.raises(EdgexError, match="lacks 1 tensors, e.g. talker.codec_head.weight"):
        load_checkpoint(broken)


def test_export_from_checkpoint(checkpoint, tmp_path):
    root, _ = checkpoint
    proc = cli_here("export", "qwen3-tts", "--checkpoint", str(root), "-c", "talker_decode", "-f", "onnx", "-p", "fp32",
                   "--out", str(tmp_path), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(proc.stdout)
    assert data["source"]["checkpoint"] == str(root.resolve())
    assert len(data["source"]["checkpoint_sha256"]) == 64  # what verify checks the folder against
    (artifact,) = data["artifacts"]
    assert artifact["verdict"] == "pass" and artifact["parity"]["min_snr_db"] > 90
    table = cli_here("export", "qwen3-tts", "--checkpoint", str(root), "-c", "talker_decode", "-f", "onnx", "-p", "fp32",
                    "--out", str(tmp_path))  # unchanged: the summary of the recorded manifest
    assert table.stdout.splitlines()[0].strip() == f"qwen3-tts (checkpoint {root.resolve()}) -> cpu  (PASS)"


def test_checkpoint_from_the_local_hub_cache(checkpoint, tmp_path, monkeypatch):
    """`--checkpoint ORG/NAME`: the same checkpoint laid out as huggingface_hub caches it (blobs,
    a snapshot of symlinks, refs/main) loads to the same tensors; nothing is downloaded."""
    from edgex.checkpoints import resolve_checkpoint

    root, original = checkpoint
    repo = tmp_path / "hub" / "models--Qwen--Qwen3-TTS-12Hz-Tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    for i, file in enumerate(p for p in sorted(root.rglob("*")) if p.is_file()):
        blob = repo / "blobs" / f"{i:040x}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(file.read_bytes())
        link = snapshot / file.relative_to(root)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    loaded = load_checkpoint(resolve_checkpoint("Qwen/Qwen3-TTS-12Hz-Tiny"))
    sa, sb = original.talker.state_dict(), loaded.talker.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert loaded.source == {"checkpoint": str(snapshot.resolve())}


def test_presets_built_without_the_construction_init_are_the_weights_the_full_init_gives(monkeypatch):
    """The construction-time random init of modules whose parameters are all written afterwards is
    left out; the tiny preset's weights are those the package's own init followed by the preset's
    gives, tensor for tensor, and the skipped types are again initialized outside the build."""
    from contextlib import nullcontext

    from torch import nn

    from edgex.recipes.qwen3_tts import models

    fast = build_from_preset(get_preset("tiny"), 0)
    assert nn.Linear(4, 4).weight.abs().sum() > 0  # restored: a plain Linear draws its weights again
    monkeypatch.setattr(models, "construct_without_random_init", lambda _types: nullcontext())
    full = build_from_preset(get_preset("tiny"), 0)
    for part in ("talker", "decoder"):
        a, b = getattr(fast, part).state_dict(), getattr(full, part).state_dict()
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a), part
