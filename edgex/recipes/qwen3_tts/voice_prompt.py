"""`edgex voice-prompt qwen3-tts`: a Base checkpoint's voice prompt from reference audio, for apps
that ship a fixed voice (no speaker or speech encoder on the device).

The prompt is what the official `Qwen3TTSModel.create_voice_clone_prompt` builds: the speaker
embedding (`extract_speaker_embedding`: the official log-mel spectrogram through the checkpoint's
`speaker_encoder`) and, for in-context cloning, the reference audio's codes (the speech tokenizer's
encode: Mimi's codes, the first 16 codebooks, ceil(samples / 1920) frames) with the transcript's
token ids. Written as a `runner.VoicePrompt` .npz, which `edgex pipeline --voice` and a device
runner read.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch

from ...artifacts.files import write_bytes_atomic
from ...errors import EdgexError
from . import runner as rn
from . import voice
from .models import load_checkpoint


def read_wav(path: Path) -> np.ndarray:
    """A 24 kHz WAV file as float32 mono in [-1, 1] (integer PCM scaled by its full range, channels
    averaged), as the official loader reads it; another rate is refused (the official code resamples
    with librosa, which edgex does not carry)."""
    from scipy.io import wavfile

    try:
        rate, data = wavfile.read(str(path))
    except (OSError, ValueError) as exc:
        raise EdgexError(f"cannot read {path} as a WAV file: {exc}") from None
    if rate != voice.SAMPLE_RATE:
        raise EdgexError(f"{path} is {rate} Hz; the voice prompt needs 24000 Hz audio (resample it first)")
    if data.dtype.kind == "i":
        data = data.astype(np.float64) / float(2 ** (8 * data.dtype.itemsize - 1))
    elif data.dtype.kind == "u":
        data = (data.astype(np.float64) - 128.0) / 128.0
    data = np.asarray(data, np.float32)
    if data.ndim > 1:
        data = data.mean(axis=-1)
    if data.size < voice.SAMPLES_PER_FRAME:
        raise EdgexError(f"{path} holds {data.size} samples: less than one 80 ms frame")
    return data.astype(np.float32)


def transcript_ids(checkpoint: Path, text: str | None, ids: list[int] | None, chat: rn.ChatTokens = rn.QWEN2_CHAT) -> np.ndarray | None:
    """The reference transcript as `runner.reference_ids` (chat-formatted with the checkpoint's
    chat-template ids): from token ids, or from text through the tokenizer the checkpoint ships
    (its tokenizer files, read locally)."""
    if ids is not None:
        return rn.reference_ids(ids, chat)
    if text is None:
        return None
    return rn.reference_ids(tokenize(checkpoint, text), chat)


def tokenize(checkpoint: Path, text: str) -> list[int]:
    """Text ids from the tokenizer the checkpoint folder ships (a Qwen2 tokenizer: vocab.json +
    merges.txt or tokenizer.json), without the chat template."""
    from transformers import AutoTokenizer

    if not any((Path(checkpoint) / name).exists() for name in ("tokenizer.json", "vocab.json", "tokenizer_config.json")):
        raise EdgexError(f"checkpoint {checkpoint} ships no tokenizer (tokenizer.json or vocab.json): pass token ids instead")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise EdgexError(f"cannot load the tokenizer of {checkpoint}: {exc}") from None
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@torch.no_grad()
def official_voice_prompt(models, audio: np.ndarray, ref_ids: np.ndarray | None) -> rn.VoicePrompt:
    """The official voice prompt of 24 kHz `audio` with the checkpoint's own modules."""
    if models.speaker_encoder is None:
        raise EdgexError("the checkpoint holds no speaker_encoder: voice prompts come from Base checkpoints")
    mels = voice.official_mels(audio)
    embedding = models.speaker_encoder(mels)[0].numpy().astype(np.float32)
    if ref_ids is None:
        return rn.VoicePrompt(embedding)
    if models.speech_encoder is None:
        raise EdgexError("the checkpoint's speech_tokenizer holds no encoder: an in-context voice prompt needs the "
                         "reference codes (give no transcript for an x-vector-only prompt)")
    codes, _ = voice.speech_reference(models.speech_encoder, torch.from_numpy(audio).reshape(1, 1, -1))
    frames = voice.frames_of(audio.size)
    return rn.VoicePrompt(embedding, codes[0, :, :frames].T.numpy().astype(np.int64), np.asarray(ref_ids, np.int64))


def write(checkpoint: Path, audio_path: Path, out: Path, text: str | None = None, ids: list[int] | None = None) -> dict:
    """Write the voice prompt of `audio_path` to `out` (.npz, atomically); returns what it holds."""
    checkpoint, out = Path(checkpoint), Path(out)
    if not out.parent.is_dir():
        raise EdgexError(f"the folder of --out {out} does not exist")
    audio = read_wav(Path(audio_path))
    models = load_checkpoint(checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    if (config.get("tts_model_type") or "custom_voice") != "base":
        raise EdgexError(f"checkpoint {checkpoint} is a {config.get('tts_model_type')} model: voice prompts are for Base checkpoints")
    prompt = official_voice_prompt(models, audio, transcript_ids(checkpoint, text, ids, rn.ChatTokens.from_config(config)))
    buffer = io.BytesIO()
    np.savez(buffer, **prompt.arrays())
    write_bytes_atomic(out, buffer.getvalue())
    return {"voice_prompt": str(out), "mode": "in-context" if prompt.in_context else "x-vector",
            "speaker_embedding": list(prompt.speaker_embedding.shape), "audio_seconds": round(audio.size / voice.SAMPLE_RATE, 3),
            "ref_frames": None if prompt.ref_codes is None else int(prompt.ref_codes.shape[0]),
            "ref_ids": None if prompt.ref_ids is None else int(prompt.ref_ids.size)}
