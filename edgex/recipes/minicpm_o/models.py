"""Build MiniCPM-o's speech path: edgex's TTS head plus the official Token2wav flow model and HiFT.

The vocoder modules are the unmodified `stepaudio2` classes, constructed as Token2wav constructs
them (the flow model from `flow.yaml`'s arguments, `HiFTGenerator` with its defaults unless a preset
or a checkpoint says otherwise). Two adjustments, neither touching the math:
  * the CFM and DiT streaming scratch buffers are hard-coded to the release (16 layers, 8 heads,
    1024 channels: a 2.1 GB `att_cache_buffer`); they are re-made at the model's own sizes. The CFM
    is constructed on the meta device so the 2.1 GB buffer is never allocated, and its noise buffer
    `rand_noise` [1, 80, 30000] is then drawn exactly where and how the official constructor draws it;
  * presets are seeded random weights (the official init zeroes the DiT's adaLN and output layers,
    which would make every graph output a constant).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .presets import MiniCPMOPreset
from .stepaudio2_import import stepaudio2_modules
from .tts import MiniCPMTTSHead

MAX_CACHE_FRAMES = 1000  # the official streaming buffers' frame capacity
MAX_STEPS = 16  # the official CFM buffers hold the caches of up to 16 Euler steps


@dataclass
class MiniCPMOModels:
    tts: MiniCPMTTSHead
    flow: nn.Module  # stepaudio2 CausalMaskedDiffWithXvec
    hift: nn.Module  # stepaudio2 HiFTGenerator
    source: dict = field(default_factory=dict)


def _scratch(*shape: int) -> torch.Tensor:
    """A float32 zero buffer whose pages the OS hands out on first write: numpy's zeros come from
    `calloc`, which maps untouched zero pages for a large block, where `torch.zeros` writes every
    byte. The official streaming buffers are scratch that a streaming call fills only as far as
    its chunk reaches (the CFM's, 2.1 GB at the released sizes, held resident by every export of
    the 4.5 preset though no graph reads it)."""
    import numpy as np

    return torch.from_numpy(np.zeros(shape, dtype=np.float32))


def build_flow(config: dict) -> nn.Module:
    """`CausalMaskedDiffWithXvec` from flow.yaml's arguments (see `presets._flow`)."""
    m = stepaudio2_modules()
    encoder = m.upsample_encoder.UpsampleConformerEncoderV2(**config["encoder"])
    est_cfg = config["decoder"]["estimator"]
    estimator = m.decoder_dit.DiT(**est_cfg)
    depth, heads, hd, hidden = est_cfg["depth"], est_cfg["num_heads"], est_cfg["head_dim"], est_cfg["hidden_size"]
    estimator.register_buffer("att_cache_buffer", _scratch(depth, 2, heads, MAX_CACHE_FRAMES, 2 * hd), persistent=False)
    estimator.register_buffer("cnn_cache_buffer", _scratch(depth, 2, 2 * hidden, 2), persistent=False)
    with torch.device("meta"):
        cfm = m.flow_matching.CausalConditionalCFM(estimator, inference_cfg_rate=config["decoder"]["inference_cfg_rate"])
    cfm.register_buffer("rand_noise", torch.randn([1, cfm.out_channels, 50 * 600]), persistent=False)
    cfm.register_buffer("cnn_cache_buffer", _scratch(MAX_STEPS, depth, 2, 2 * hidden, 2), persistent=False)
    cfm.register_buffer("att_cache_buffer", _scratch(MAX_STEPS, depth, 2, heads, MAX_CACHE_FRAMES, 2 * hd),
                        persistent=False)
    top = {k: v for k, v in config.items() if k not in ("encoder", "decoder")}
    return m.flow.CausalMaskedDiffWithXvec(**top, encoder=encoder, decoder=cfm).eval()


def build_hift(config: dict) -> nn.Module:
    m = stepaudio2_modules()
    f0 = m.hifigan.ConvRNNF0Predictor(cond_channels=config["f0_channels"])
    return m.hifigan.HiFTGenerator(base_channels=config["base_channels"], f0_predictor=f0).eval()


@torch.no_grad()
def randomize(module: nn.Module, seed: int) -> None:
    """Seeded weights with unit-scale activations: matrices and kernels ~ N(0, 1/fan_in), norm
    scales ~ 1, biases small. Weight-norm magnitudes (`original0`) keep their construction value
    (the norm of the direction they scale), so folded weights keep the same scale."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        if name.endswith("original0"):
            continue
        noise = torch.randn(p.shape, generator=gen)
        if p.dim() >= 2:
            p.copy_(noise * (p[0].numel() ** -0.5))
        elif name.endswith("bias"):
            p.copy_(noise * 0.02)
        else:
            p.copy_(1.0 + 0.1 * noise)
    for mod in module.modules():  # weight norm: magnitude = the direction's norm at the new weights
        parametrizations = getattr(mod, "parametrizations", None)
        if parametrizations is not None and "weight" in parametrizations:
            w = parametrizations.weight
            dims = tuple(range(1, w.original1.dim()))
            w.original0.copy_(w.original1.norm(dim=dims, keepdim=True) if dims else w.original1.abs())


@torch.no_grad()
def _speech_like_hift(hift: nn.Module) -> None:
    """Random HiFT weights give F0 near 0 Hz (every sample unvoiced: the sine source, the part
    whose float32 phase accumulation limits parity, would go untested) and magnitudes that pin
    the wav at the +-0.99 clamp. Offset the F0 head to ~200 Hz and damp conv_post."""
    hift.f0_predictor.classifier.bias.add_(200.0)
    hift.conv_post.parametrizations.weight.original0.mul_(0.2)


def build_from_preset(preset: MiniCPMOPreset, seed: int) -> MiniCPMOModels:
    torch.manual_seed(seed)
    tts = MiniCPMTTSHead(preset.tts).eval()
    flow = build_flow(preset.flow)
    hift = build_hift(preset.hift)
    for i, module in enumerate((tts, flow, hift)):
        randomize(module, seed * 3 + i)
    _speech_like_hift(hift)
    return MiniCPMOModels(tts, flow, hift, {"preset": preset.name, "seed": seed})
