"""Write a preset's seeded random weights as a checkpoint folder in the model's published layout.

    .venv/bin/python scripts/write_checkpoint.py qwen3-tts --preset tiny --out ckpt/qwen3-tts-tiny

For trying `edgex export --checkpoint DIR` without downloading a model: the folder has the layout
the recipe reads (docs/models.md, "Checkpoint layouts"), its weights are the preset's, and the
folder is written beside its destination and renamed into place when complete.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgex.errors import EdgexError  # noqa: E402
from edgex.logs import native_output_quiet, quiet_libraries  # noqa: E402

SUPPORTED = ("qwen3-tts",)


def write_qwen3_tts(preset_name: str, seed: int, folder: Path) -> None:
    """A Base checkpoint: `config.json` + `model.safetensors` (`talker.*`, and `speaker_encoder.*`
    with its `speaker_encoder_config` where the preset has one), `speech_tokenizer/` (`decoder.*`,
    and `encoder.*` with its `encoder_config` where the preset has the speech tokenizer's encoder),
    so `edgex voice-prompt` reads it as it reads a published Base checkpoint."""
    from safetensors.torch import save_file

    from edgex.recipes.qwen3_tts.models import build_from_preset
    from edgex.recipes.qwen3_tts.official import preset_config
    from edgex.recipes.qwen3_tts.presets import get_preset

    preset = get_preset(preset_name)
    models = build_from_preset(preset, seed=seed)
    (folder / "speech_tokenizer").mkdir(parents=True)
    config = preset_config(preset.talker, "base")  # the published Base config's tables and keys
    tokenizer = {"decoder_config": preset.decoder}
    talker = {f"talker.{k}": v.contiguous() for k, v in models.talker.state_dict().items()}
    speech = {f"decoder.{k}": v.contiguous() for k, v in models.decoder.state_dict().items()}
    if models.speaker_encoder is not None:
        config["speaker_encoder_config"] = preset.speaker_encoder
        talker |= {f"speaker_encoder.{k}": v.contiguous() for k, v in models.speaker_encoder.state_dict().items()}
    if models.speech_encoder is not None:
        tokenizer["encoder_config"] = preset.speech_encoder
        speech |= {f"encoder.{k}": v.contiguous() for k, v in models.speech_encoder.state_dict().items()}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "speech_tokenizer" / "config.json").write_text(json.dumps(tokenizer, indent=2))
    save_file(talker, str(folder / "model.safetensors"))
    save_file(speech, str(folder / "speech_tokenizer" / "model.safetensors"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help=f"model recipe ({', '.join(SUPPORTED)})")
    parser.add_argument("--preset", default="tiny", help="preset whose seeded random weights are written (default: tiny)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the preset's weights")
    parser.add_argument("--out", type=Path, required=True, help="checkpoint folder to write (must not exist)")
    args = parser.parse_args(argv)
    try:
        if args.model not in SUPPORTED:
            raise EdgexError(f"no checkpoint writer for {args.model!r} (known: {', '.join(SUPPORTED)})")
        if args.out.exists():
            raise EdgexError(f"{args.out} exists: give a new folder")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{args.out.name}-", dir=args.out.parent))
        try:
            with native_output_quiet():  # torch's and torchao's import-time warnings
                quiet_libraries()
                write_qwen3_tts(args.preset, args.seed, staging / "ckpt")
            (staging / "ckpt").rename(args.out)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except (EdgexError, OSError) as exc:
        print(f"edgex: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.model} preset {args.preset} (seed {args.seed}) in the published layout: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
