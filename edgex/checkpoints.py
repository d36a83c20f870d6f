"""Where a `--checkpoint` lives: a local folder, or a Hugging Face hub id found in the local cache.

`--checkpoint Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice` (optionally `@REVISION`) is looked up in the
hub cache that `huggingface_hub` fills (`HF_HUB_CACHE`, else `HF_HOME/hub`, else
`~/.cache/huggingface/hub`), laid out as `models--ORG--NAME/refs/<revision>` (a commit hash) and
`models--ORG--NAME/snapshots/<commit>/...`. edgex never downloads: a miss says where it looked.
"""

from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

from .errors import EdgexError

_HEADER_LIMIT = 100 * 2**20  # safetensors' own bound on a header's size
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")


def hub_cache_dir() -> Path:
    """The hub cache folder, by the same environment variables `huggingface_hub` reads."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return cache / "huggingface" / "hub"


def is_hub_id(text: str) -> bool:
    return bool(_REPO_ID.match(text))


def cached_snapshot(repo_id: str, revision: str = "main") -> tuple[Path | None, Path]:
    """(snapshot folder or None, where it was looked for) for `repo_id` at `revision` (a branch or
    tag under `refs/`, or a commit hash)."""
    repo = hub_cache_dir() / f"models--{repo_id.replace('/', '--')}"
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = repo / "snapshots" / commit
    return (snapshot if snapshot.is_dir() else None), (snapshot if ref.is_file() else ref)


def resolve_checkpoint(value: Path | str) -> Path:
    """A local checkpoint folder for `value`: the folder itself if it exists, else a hub id
    (`ORG/NAME` or `ORG/NAME@REVISION`) resolved from the local cache, never downloaded."""
    path = Path(value).expanduser()
    if path.exists():
        return path
    text = str(value)
    if not is_hub_id(text):
        raise EdgexError(f"checkpoint {value} does not exist")
    repo_id, _, revision = text.partition("@")
    snapshot, looked = cached_snapshot(repo_id, revision or "main")
    if snapshot is None:
        raise EdgexError(
            f"checkpoint {text} is neither a folder nor in the local Hugging Face cache (looked for {looked}; "
            f"set HF_HUB_CACHE or HF_HOME to another cache): edgex never downloads, fetch it first with "
            f"`huggingface-cli download {repo_id}`"
        )
    return snapshot


def safetensors_header(path: Path) -> dict:
    """A safetensors file's header (tensor name -> dtype, shape, offsets; `__metadata__`), read
    alone: no tensor is read. OSError / ValueError / struct.error where it cannot be read."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        if size > _HEADER_LIMIT:
            raise ValueError(f"{path}: a safetensors header of {size} bytes")
        return json.loads(f.read(size))
