"""Load a local MiniCPM-o 4.5 checkpoint: the TTS head from the model's safetensors, Token2wav from its own files.

Layout read (never downloaded):
  DIR/config.json             `tts_config` (MiniCPMTTSConfig's fields: sizes, token ids)
  DIR/*.safetensors           only the `tts.*` tensors are read (the LLM's are left on disk)
  DIR/token2wav/ or DIR/assets/token2wav/ or DIR/
      flow.yaml               the flow model's constructor arguments (hyperpyyaml `!new:` tags)
      flow.pt, hift.pt        state dicts, read with torch.load(weights_only=True) only
Sizes come from these files (flow.yaml's arguments, hift.pt's tensor shapes); every missing or
mismatched tensor, a missing vocoder file and absent weight-norm tensors are one-line errors.
flow.yaml is parsed with a YAML loader that knows `!new:` for the four vocoder classes and `!ref`
to a top-level key, nothing else: no object is built from the file.
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from ...errors import EdgexError
from ..base import read_config_json
from .models import MiniCPMOModels, build_flow, build_hift
from .tts import MiniCPMTTSHead

_CLASSES = {
    "cosyvoice2.flow.flow.CausalMaskedDiffWithXvec": "flow",
    "cosyvoice2.transformer.upsample_encoder_v2.UpsampleConformerEncoderV2": "encoder",
    "cosyvoice2.flow.flow_matching.CausalConditionalCFM": "cfm",
    "cosyvoice2.flow.decoder_dit.DiT": "dit",
}
_TTS_FIELDS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers", "num_key_value_heads",
               "max_position_embeddings", "num_audio_tokens", "num_text_tokens", "llm_dim", "audio_bos_token_id",
               "text_eos_token_id")
_WEIGHT_NORM = ".parametrizations.weight.original"


class _FlowYamlLoader(yaml.SafeLoader):
    pass


def _new(loader, suffix, node):
    name = suffix.removeprefix("stepaudio2.")
    if name not in _CLASSES:
        raise EdgexError(f"flow.yaml builds {suffix!r}: edgex reads only the Token2wav classes ({', '.join(_CLASSES)})")
    return {"__class__": _CLASSES[name], **loader.construct_mapping(node, deep=True)}


def _ref(loader, node):
    return ("__ref__", loader.construct_scalar(node).strip("<> "))


_FlowYamlLoader.add_multi_constructor("!new:", _new)
_FlowYamlLoader.add_constructor("!ref", _ref)


def _resolve(value, top: dict):
    if isinstance(value, tuple) and value[:1] == ("__ref__",):
        if value[1] not in top:
            raise EdgexError(f"flow.yaml: !ref <{value[1]}> names no top-level key")
        return _resolve(top[value[1]], top)
    if isinstance(value, dict):
        return {k: _resolve(v, top) for k, v in value.items()}
    return value


def read_flow_yaml(path: Path) -> dict:
    """flow.yaml -> the nested argument dict `build_flow` takes."""
    try:
        top = yaml.load(path.read_text(), Loader=_FlowYamlLoader)
    except yaml.YAMLError as exc:
        raise EdgexError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    flow = _resolve((top or {}).get("flow"), top or {})
    if not isinstance(flow, dict) or flow.get("__class__") != "flow":
        raise EdgexError(f"{path} has no `flow: !new:cosyvoice2.flow.flow.CausalMaskedDiffWithXvec` entry")
    encoder, cfm = flow.get("encoder"), flow.get("decoder")
    if not (isinstance(encoder, dict) and encoder.get("__class__") == "encoder" and isinstance(cfm, dict)
            and cfm.get("__class__") == "cfm" and isinstance(cfm.get("estimator"), dict)):
        raise EdgexError(f"{path}: the flow entry lacks its encoder / CFM decoder / DiT estimator")
    strip = lambda d: {k: v for k, v in d.items() if k != "__class__"}  # noqa: E731
    estimator = strip(cfm["estimator"])
    config = {k: v for k, v in strip(flow).items() if k not in ("encoder", "decoder", "input_embedding")}
    config["encoder"] = strip(encoder)
    config["decoder"] = {"inference_cfg_rate": cfm.get("inference_cfg_rate", 0.7), "estimator": estimator}
    return config


def _torch_load(path: Path) -> dict:
    if not path.is_file():
        raise EdgexError(f"checkpoint is missing the vocoder file {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle refusals and corrupt archives alike: one line
        raise EdgexError(f"cannot read {path} as a weights-only state dict: {str(exc).splitlines()[0]}") from None
    if not isinstance(state, dict):
        raise EdgexError(f"{path} is not a state dict")
    return state


def _load_into(module: torch.nn.Module, state: dict, what: str, prefix: str = "") -> None:
    expected = module.state_dict()
    norm = [k for k in expected if _WEIGHT_NORM in k]
    if norm and not any(prefix + k in state for k in norm):
        raise EdgexError(f"{what}: weight-norm tensors absent (e.g. {prefix}{norm[0]}): expected the "
                         "parametrized original0/original1 pairs of torch.nn.utils.parametrizations.weight_norm")
    missing = [k for k in expected if prefix + k not in state]
    if missing:
        raise EdgexError(f"{what} lacks {len(missing)} tensors, e.g. {prefix}{missing[0]}")
    for k, v in expected.items():
        got = tuple(state[prefix + k].shape)
        if got != tuple(v.shape):
            raise EdgexError(f"{what} tensor {prefix}{k} has shape {got}, its configuration says {tuple(v.shape)}")
    module.load_state_dict({k: state[prefix + k].float() for k in expected}, strict=True)


def _tts_tensors(folder: Path) -> dict:
    """Only the `tts.*` tensors of the model's safetensors shards."""
    from safetensors import SafetensorError, safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise EdgexError(f"checkpoint folder {folder} has no .safetensors file")
    state = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    if key.startswith("tts."):
                        state[key] = f.get_tensor(key)
        except (SafetensorError, OSError, ValueError) as exc:
            raise EdgexError(f"corrupt safetensors file {file}: {exc}") from None
    if not state:
        raise EdgexError(f"no tts.* tensors in {folder}'s safetensors: not a MiniCPM-o checkpoint with speech output")
    return state


def _tts_config(config: dict, path: Path) -> dict:
    tts = config.get("tts_config")
    if not isinstance(tts, dict):
        raise EdgexError(f"{path} has no tts_config: not a MiniCPM-o checkpoint")
    missing = [k for k in _TTS_FIELDS if k not in tts]
    if missing:
        raise EdgexError(f"{path} tts_config lacks {', '.join(missing)}")
    if tts.get("projector_type", "mlp") != "mlp" or tts.get("num_vq", 1) != 1:
        raise EdgexError(f"{path} tts_config: edgex supports projector_type 'mlp' with one codebook (num_vq 1)")
    out = {k: tts[k] for k in _TTS_FIELDS}
    out.update(num_vq=1, projector_type="mlp", normalize_projected_hidden=bool(tts.get("normalize_projected_hidden", False)))
    return out


def _vocoder_dir(path: Path) -> Path:
    for folder in (path / "token2wav", path / "assets" / "token2wav", path):
        if (folder / "flow.yaml").is_file():
            return folder
    raise EdgexError(f"checkpoint is missing the vocoder file flow.yaml (looked in {path}/token2wav, "
                     f"{path}/assets/token2wav and {path})")


def _hift_sizes(state: dict, path: Path) -> dict:
    try:
        return {"base_channels": int(state["conv_pre" + _WEIGHT_NORM + "1"].shape[0]),
                "f0_channels": int(state["f0_predictor.condnet.0" + _WEIGHT_NORM + "1"].shape[0])}
    except KeyError as exc:
        raise EdgexError(f"{path}: weight-norm tensors absent ({exc.args[0]} not found)") from None


def load_checkpoint(path: Path, seed: int = 0) -> MiniCPMOModels:
    """The checkpoint's models. The official CFM draws its noise buffer (`rand_noise`, the noise of
    every official non-streaming call) from torch's global generator when it is built: it is seeded
    with `seed` first, so the same checkpoint and seed give the same buffer, and the same samples,
    in every process."""
    if not path.is_dir():
        raise EdgexError(f"checkpoint {path} is not a directory")
    tts_config = _tts_config(read_config_json(path / "config.json"), path / "config.json")
    vocoder = _vocoder_dir(path)
    flow_config = read_flow_yaml(vocoder / "flow.yaml")
    flow_state, hift_state = _torch_load(vocoder / "flow.pt"), _torch_load(vocoder / "hift.pt")
    hift_state = {k.removeprefix("generator."): v for k, v in hift_state.items()}
    tts_state = _tts_tensors(path)
    try:
        head = MiniCPMTTSHead(tts_config).eval()
        torch.manual_seed(seed)
        flow = build_flow(flow_config)
        hift = build_hift(_hift_sizes(hift_state, vocoder / "hift.pt"))
    except (TypeError, ValueError, KeyError) as exc:
        raise EdgexError(f"checkpoint configuration in {path} is invalid: {type(exc).__name__}: {exc}") from None
    _load_into(head, tts_state, "checkpoint TTS head", "tts.")
    _load_into(flow, flow_state, f"{vocoder / 'flow.pt'}")
    _load_into(hift, hift_state, f"{vocoder / 'hift.pt'}")
    return MiniCPMOModels(head, flow, hift, {"checkpoint": str(path.resolve())})
