"""Import the unmodified qwen-tts model code without running its package ``__init__``.

``qwen-tts==0.1.1`` is installed with ``--no-deps``: its package ``__init__`` pulls gradio, librosa and
soundfile, but the three model files need only torch + transformers. We load those files under a
private package name so relative imports resolve, give librosa's mel filter (the speaker encoder's
mel spectrogram) transformers' equivalent where librosa is absent, give the tokenizer front-end a
placeholder that fails loudly if called, and leave any real ``qwen_tts`` import of the user untouched.
"""

from __future__ import annotations

import importlib
import importlib.util
import types
from functools import cache
from pathlib import Path

from ...errors import EdgexError
from ...patches.imports import OWN_PREFIX, own_packages, package, qwen_tts_models
from ...patches.transformers import generation_without_sklearn

_ALIAS = OWN_PREFIX + "qwen_tts"


def _not_available(name: str):
    def fail(*_args, **_kwargs):
        raise EdgexError(f"{name} is not available in edgex's qwen-tts import (install librosa/qwen-tts fully)")

    return fail


def slaney_mel(*, sr: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None):
    """`librosa.filters.mel(sr=, n_fft=, n_mels=, fmin=, fmax=)` with its defaults (Slaney mel scale and
    area normalisation) from transformers' `mel_filter_bank`: [n_mels, n_fft // 2 + 1] float32."""
    from transformers.audio_utils import mel_filter_bank

    bank = mel_filter_bank(num_frequency_bins=n_fft // 2 + 1, num_mel_filters=n_mels, min_frequency=fmin,
                           max_frequency=sr / 2 if fmax is None else fmax, sampling_rate=sr, norm="slaney",
                           mel_scale="slaney")
    return bank.T.astype("float32")


@cache
def qwen_tts_modules() -> types.SimpleNamespace:
    """Return the qwen-tts configuration and modeling modules (talker and 12 Hz tokenizer)."""
    spec = importlib.util.find_spec("qwen_tts")
    if spec is None or not spec.submodule_search_locations:
        raise EdgexError("qwen-tts is not installed: pip install --no-deps qwen-tts==0.1.1")
    root = Path(list(spec.submodule_search_locations)[0])
    own_packages({_ALIAS + sub: package(_ALIAS + sub, root / sub.lstrip(".").replace(".", "/"))
                  for sub in ("", ".core", ".core.models", ".core.tokenizer_12hz", ".inference")})
    tokenizer_front = types.ModuleType(_ALIAS + ".inference.qwen3_tts_tokenizer")
    tokenizer_front.Qwen3TTSTokenizer = _not_available("Qwen3TTSTokenizer")
    import transformers  # noqa: F401  (imported before a placeholder librosa can confuse its probes)

    placeholders = {tokenizer_front.__name__: tokenizer_front}
    if importlib.util.find_spec("librosa") is None:
        filters = types.ModuleType("librosa.filters")
        filters.mel = slaney_mel
        placeholders |= {"librosa": types.ModuleType("librosa"), "librosa.filters": filters}
        placeholders["librosa"].filters = filters
    with qwen_tts_models(placeholders), generation_without_sklearn():
        return _load_modules()


def _load_modules() -> types.SimpleNamespace:
    load = importlib.import_module
    return types.SimpleNamespace(
        config=load(_ALIAS + ".core.models.configuration_qwen3_tts"),
        modeling=load(_ALIAS + ".core.models.modeling_qwen3_tts"),
        tokenizer_config=load(_ALIAS + ".core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2"),
        tokenizer_modeling=load(_ALIAS + ".core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2"),
    )
