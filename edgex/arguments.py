"""Command-line values into the library's: comma lists, sizes, request files, token id lists.
Bad values are one-line `EdgexError`s naming the option."""

from __future__ import annotations

import json
from pathlib import Path

from .errors import EdgexError


def split_values(values: list[str] | None) -> list[str] | None:
    """Accept repeated options and comma lists alike."""
    if not values:
        return None
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


def calibration_sizes(values: list[str] | None) -> list[int] | None:
    """`--calibration 8,16 --calibration 32` -> [8, 16, 32]."""
    sizes = []
    for text in split_values(values) or []:
        if not text.isdigit() or int(text) < 1:
            raise EdgexError(f"bad --calibration {text!r}: expected positive integers, e.g. 8,16,32")
        sizes.append(int(text))
    return sizes or None


def request_spec(path: Path | None, text: str | None, voice: Path | None) -> dict | None:
    """The official-utterance request of `edgex pipeline`: a JSON file, or --text (with --voice)."""
    if path is None:
        return None if text is None else {"text": text, **({"voice": str(voice.resolve())} if voice is not None else {})}
    if text is not None or voice is not None:
        raise EdgexError("--request holds the whole request: give text and voice inside it, not as --text / --voice")
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EdgexError(f"--request {path}: not a readable JSON file ({exc})") from None
    if not isinstance(spec, dict):
        raise EdgexError(f"--request {path}: expected a JSON object")
    return spec


def transcript_ids(text: str | None, ids: str | None) -> list[int] | None:
    """`voice-prompt --ids 1,2,3` -> [1, 2, 3]; the transcript is --text or --ids, not both."""
    if text is not None and ids is not None:
        raise EdgexError("give the transcript as --text or as --ids, not both")
    try:
        return None if ids is None else [int(i) for i in ids.split(",") if i.strip()]
    except ValueError:
        raise EdgexError(f"--ids {ids!r}: expected comma-separated integers") from None
