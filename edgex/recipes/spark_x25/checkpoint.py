"""Load a local Spark-X2.5 checkpoint: `config.json` + `*.safetensors`, published names as-is.

The attention input projection is stored fused (`self_attn.q_k_v_proj`, rows in q, k, v order),
as the model defines it; a checkpoint with split `q_proj`/`k_proj`/`v_proj` tensors is fused on
load. There is no `lm_head` tensor (tied to `model.embedding`). Published weights are bf16 and are
loaded as fp32, the reference precision.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from ...errors import EdgexError
from ..base import read_config_json, read_safetensors
from .config import SparkConfig
from .model import SparkForCausalLM

_SPLIT = re.compile(r"^(model\.layers\.\d+\.self_attn)\.q_proj\.weight$")


def _fuse_split_qkv(state: dict) -> dict:
    for name in [n for n in state if _SPLIT.match(n)]:
        prefix = _SPLIT.match(name).group(1)
        parts = [f"{prefix}.{p}_proj.weight" for p in "qkv"]
        if all(p in state for p in parts):
            state[f"{prefix}.q_k_v_proj.weight"] = torch.cat([state.pop(p) for p in parts], dim=0)
    return state


def load_checkpoint(path: Path) -> SparkForCausalLM:
    path = Path(path)
    if not path.is_dir():
        raise EdgexError(f"checkpoint {path} is not a directory")
    raw = read_config_json(path / "config.json")
    try:
        config = SparkConfig.from_dict(raw)
    except (TypeError, ValueError) as exc:
        raise EdgexError(f"checkpoint config {path / 'config.json'} is not a Spark-X2.5 config: {exc}") from None
    state = _fuse_split_qkv(read_safetensors(path))
    model = SparkForCausalLM(config).eval()
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    if missing:
        raise EdgexError(f"checkpoint {path} lacks {len(missing)} tensors, e.g. {missing[0]}")
    unexpected = [k for k in state if k not in expected]
    if unexpected:
        raise EdgexError(f"checkpoint {path} has {len(unexpected)} tensors this model does not define, e.g. {unexpected[0]}")
    bad = [k for k in expected if tuple(state[k].shape) != tuple(expected[k].shape)]
    if bad:
        raise EdgexError(f"checkpoint tensor {bad[0]} has shape {tuple(state[bad[0]].shape)}, config says {tuple(expected[bad[0]].shape)}")
    model.load_state_dict({k: state[k].float() for k in expected}, strict=True)
    return model
