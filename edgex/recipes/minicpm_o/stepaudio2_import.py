"""Import Step-Audio2's Token2wav vocoder modules from `minicpmo-utils==1.0.5` without its package `__init__`.

`minicpmo-utils` is installed with `--no-deps`: its pins (transformers < 4.53, onnxruntime <= 1.21,
librosa 0.9) conflict with edgex's. The package `stepaudio2/__init__.py` imports `Token2wav`, whose
module pulls torchaudio, s3tokenizer (the speech tokenizer), hyperpyyaml and the CAM++ speaker model:
none of them is part of the vocoder's math. We load only the vocoder's own files under a private
package name so their absolute `stepaudio2.` imports resolve to the same files:

  * flow model: `cosyvoice2.flow.flow` (`CausalMaskedDiffWithXvec`), `cosyvoice2.flow.flow_matching`
    (`CausalConditionalCFM`), `cosyvoice2.flow.decoder_dit` (`DiT`),
    `cosyvoice2.transformer.upsample_encoder_v2` (`UpsampleConformerEncoderV2`);
  * HiFT: `flashcosyvoice.modules.hifigan` (`HiFTGenerator`).

Placeholders (each an empty package module, so that no `__init__` with heavy imports runs):
`stepaudio2` (its `__init__` imports Token2wav: torchaudio, s3tokenizer, hyperpyyaml),
`stepaudio2.flashcosyvoice` and `stepaudio2.flashcosyvoice.modules` (their siblings hold the
flash-attention LLM engine, which HiFT never touches). The files' real third-party imports are
installed: einops (the DiT packs its inputs with it; a real dependency, in scripts/setup),
scipy (HiFT's Hann window) and onnxruntime (imported by flow_matching, unused on this path).
The placeholders are in place only while the files are imported (`edgex.patches.imports`).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from functools import cache
from pathlib import Path

from ...errors import EdgexError
from ...patches.imports import package, stepaudio2_vocoder

_PACKAGES = ("", ".cosyvoice2", ".cosyvoice2.flow", ".cosyvoice2.transformer", ".cosyvoice2.utils",
             ".flashcosyvoice", ".flashcosyvoice.modules", ".flashcosyvoice.modules.hifigan_components")


@cache
def stepaudio2_modules() -> types.SimpleNamespace:
    """The vocoder modules of `stepaudio2` (flow, flow_matching, decoder_dit, upsample encoder, hifigan)."""
    spec = importlib.util.find_spec("stepaudio2") if "stepaudio2" not in sys.modules else sys.modules["stepaudio2"].__spec__
    if spec is None or not spec.submodule_search_locations:
        raise EdgexError("minicpmo-utils is not installed: pip install --no-deps minicpmo-utils==1.0.5 einops==0.8.2")
    if importlib.util.find_spec("einops") is None:
        raise EdgexError("einops is not installed (the Token2wav DiT needs it): pip install einops==0.8.2")
    load = importlib.import_module
    with package_placeholders():
        return types.SimpleNamespace(
            flow=load("stepaudio2.cosyvoice2.flow.flow"),
            flow_matching=load("stepaudio2.cosyvoice2.flow.flow_matching"),
            decoder_dit=load("stepaudio2.cosyvoice2.flow.decoder_dit"),
            upsample_encoder=load("stepaudio2.cosyvoice2.transformer.upsample_encoder_v2"),
            hifigan=load("stepaudio2.flashcosyvoice.modules.hifigan"),
            hifigan_layers=load("stepaudio2.flashcosyvoice.modules.hifigan_components.layers"),
        )


def package_placeholders(front_end: dict[str, types.ModuleType] | None = None):
    """The package placeholders (and `front_end`'s) in place while the files are imported: the files
    import each other as `stepaudio2.…`, so those names must be these files. A user's own full
    `stepaudio2` import (with its __init__) is left as it is; only a missing one is stubbed."""
    spec = importlib.util.find_spec("stepaudio2") if "stepaudio2" not in sys.modules else sys.modules["stepaudio2"].__spec__
    root = Path(list(spec.submodule_search_locations)[0])
    stubs = {"stepaudio2" + sub: package("stepaudio2" + sub, root / sub.lstrip(".").replace(".", "/")) for sub in _PACKAGES}
    return stepaudio2_vocoder({**stubs, **(front_end or {})})
