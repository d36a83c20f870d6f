"""What llama.cpp's libmtmd can run of a Qwen3-TTS checkpoint, from its configs alone (no torch).

libmtmd runs the code predictor and Code2Wav from an mmproj GGUF that it loads only with an input
encoder, the speaker encoder Base checkpoints hold; and `clip.cpp` (`PROJECTOR_TYPE_QWEN3TTS_GEN`)
hard-codes Code2Wav's sizes and the predictor's RoPE base instead of reading them from the file.
`declared_files` is the recipe's declaration for `Placement.declared_only` (`RecipeFacts.declared_files`).
"""

from __future__ import annotations

import json
from pathlib import Path

# clip.cpp's fixed Code2Wav sizes for qwen3tts_gen (not read from the file)
LIBMTMD_CODE2WAV = {"num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16, "sliding_window": 72,
                    "upsampling_ratios": [2, 2], "upsample_rates_blocks": 4, "rope_theta": 10000.0, "rms_norm_eps": 1e-5}
LIBMTMD_PREDICTOR = {"rope_theta": 1000000.0}
NO_SPEAKER_ENCODER = ("llama.cpp's mmproj (code predictor + Code2Wav, run by libmtmd) loads only with a speaker encoder, "
                      "which Base checkpoints hold and CustomVoice / VoiceDesign ones do not (llama.cpp's converter "
                      "fails on them too); their talker GGUF is built")
# The components libmtmd has no graph for, each with the one it runs instead.
_OTHER_GRAPHS = {
    "code_predictor_step": "llama.cpp runs the code predictor as libmtmd's whole-frame graph (code_predictor), "
                           "not one position a call",
    "code2latent": "llama.cpp runs Code2Wav as libmtmd's windowed graph (code2wav), not split in two",
    "latent2wav": "llama.cpp runs Code2Wav as libmtmd's windowed graph (code2wav), not split in two",
    "speaker_encoder": "libmtmd runs the speaker encoder only inside its `mtmd_helper` TTS functions, from reference audio through its "
                       "own mel front end, not as a graph with the component's mel input",
    "speech_encoder": "llama.cpp's converter does not convert the speech tokenizer's encoder",
}


def unsupported_reason(talker_config: dict, decoder_config: dict, has_speaker_encoder: bool) -> str | None:
    """Why llama.cpp cannot run this checkpoint's predictor and Code2Wav from an mmproj, or None. A
    size the decoder config leaves out is taken as libmtmd's (the build-time check, on the config
    class with its defaults, is the last word)."""
    if not has_speaker_encoder:
        return NO_SPEAKER_ENCODER
    fixed = LIBMTMD_CODE2WAV
    found = {key: decoder_config.get(key, fixed.get(key)) for key in fixed}
    found["upsampling_ratios"] = list(found["upsampling_ratios"] or ())
    found["upsample_rates_blocks"] = len(decoder_config["upsample_rates"]) if "upsample_rates" in decoder_config \
        else fixed["upsample_rates_blocks"]
    found["rope_theta"], found["rms_norm_eps"] = float(found["rope_theta"]), float(found["rms_norm_eps"])
    wrong = [f"{key} {found[key]} (libmtmd: {value})" for key, value in fixed.items() if found[key] != value]
    predictor = talker_config.get("code_predictor_config") or {}
    theta = float(predictor.get("rope_theta", LIBMTMD_PREDICTOR["rope_theta"]))
    if theta != LIBMTMD_PREDICTOR["rope_theta"]:
        wrong.append(f"code predictor rope_theta {theta:g} (libmtmd: {LIBMTMD_PREDICTOR['rope_theta']:g})")
    if wrong:
        return "libmtmd hard-codes Qwen3-TTS's Code2Wav and predictor sizes, this checkpoint differs: " + ", ".join(wrong)
    return None


def _tensor_names(folder: Path) -> set[str]:
    """The tensor names of the folder's safetensors files, from their headers only."""
    from ...checkpoints import safetensors_header

    names = set()
    for path in sorted(folder.glob("*.safetensors")):
        names |= set(safetensors_header(path))
    return names


def checkpoint_reason(folder: Path) -> str | None:
    """`unsupported_reason` for a checkpoint folder in the Hugging Face layout."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        tokenizer = json.loads((folder / "speech_tokenizer" / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"cannot read the checkpoint's configs for llama.cpp's mmproj: {exc}"
    speaker = "speaker_encoder_config" in config and any(n.startswith("speaker_encoder.") for n in _tensor_names(folder))
    return unsupported_reason(config.get("talker_config") or {}, tokenizer.get("decoder_config") or {}, speaker)


def declared_files(exporter: str, preset: str | None, checkpoint: Path | None) -> dict[str, str | None]:
    """The GGUF files this recipe writes for libmtmd (`RecipeFacts.declared_files`): code_predictor
    and code2wav, both the whole mmproj, where libmtmd can run the checkpoint's; reasons otherwise."""
    if exporter != "gguf":
        return {}
    if checkpoint is not None:
        reason = checkpoint_reason(Path(checkpoint))
    else:
        from .presets import get_preset

        p = get_preset(preset or "tiny")
        reason = unsupported_reason(p.talker, p.decoder, p.speaker_encoder is not None)
    return {"code_predictor": reason, "code2wav": reason, **_OTHER_GRAPHS}
