"""The ExecuTorch exporter's graph rewrites keep XNNPACK's partitions few and the numbers unchanged.

A block with hand-written norms (`x.mean(-1, keepdim=True)`, as MiniCPM-o's DiT, LeRobot's policies
and every RMSNorm write them) and a constant-only branch (a position table built from `arange`):
lowered by the real exporter, run by the real ExecuTorch runtime."""

import torch
from torch import nn

from edgex.component import Component, TensorSpec
from edgex.exporters.executorch import ExecuTorchExporter
from edgex.parity.metrics import snr_db
from edgex.parity.runtimes.executorch import ExecuTorchRuntime


class _HandNormBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(32, 64), nn.Linear(64, 32)

    def forward(self, x):
        centered = x - x.mean(dim=-1, keepdim=True)
        x = centered * torch.rsqrt((centered * centered).mean(dim=-1, keepdim=True) + 1e-5)
        positions = torch.sin(torch.arange(8, dtype=torch.float32)[:, None] * torch.linspace(0.1, 1.0, 32))
        h = self.up(x + positions)
        return self.down(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_hand_written_norms_and_constant_branches_lower_into_one_xnnpack_partition(tmp_path):
    torch.manual_seed(0)
    module = _HandNormBlock().eval()
    x = torch.randn(2, 8, 32)
    component = Component("hand_norm", "decoder", module, [TensorSpec("x", (2, 8, 32), "float32")],
                          [TensorSpec("y", (2, 8, 32), "float32")], reference=lambda x: (module(x),), samples={"s": (x,)})
    result = ExecuTorchExporter().export(component, "fp32", tmp_path / "hand_norm.pte")
    # without the rewrites, the three rank-3 means and the sin / arange branch stay outside the
    # delegate and split it into four partitions
    assert result.details["delegate_subgraphs"] == 1
    (out,) = ExecuTorchRuntime().load(result.files, 1).run([x.numpy()])
    with torch.no_grad():
        assert snr_db(module(x).numpy(), out) > 100


class _RmsNormBlock(nn.Module):
    """Linear -> edgex's RMSNorm (an HF RMSNorm's parameters) over 1024 channels, then over each of 8
    heads of 128 -> Linear."""

    def __init__(self):
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm

        from edgex.nn.transformer import attach_norm_constants

        super().__init__()
        self.up, self.norm, self.down = nn.Linear(64, 1024), Qwen3RMSNorm(1024, eps=1e-6), nn.Linear(1024, 64)
        self.head_norm = Qwen3RMSNorm(128, eps=1e-6)  # as Qwen3's q / k norms: per head, on a rank-4 tensor
        attach_norm_constants(self)

    def forward(self, x):
        from edgex.nn.transformer import rms_norm

        heads = rms_norm(self.norm, self.up(x)).view(*x.shape[:2], 8, 128)
        return self.down(rms_norm(self.head_norm, heads).view(*x.shape[:2], 1024))


def _fp16_pte_rows(module, x, dest, rows) -> tuple[int, list[float]]:
    """`module` (same input and output shape) lowered in fp16 by the real exporter and run by the
    real runtime on `x`: its XNNPACK partitions, and the SNR in dB of each slice of rows against the
    float32 module."""
    with torch.no_grad():
        reference = module(x)
    spec = [TensorSpec("x", tuple(x.shape), "float32")]
    component = Component(dest.stem, "decoder", module, spec, [TensorSpec("y", tuple(x.shape), "float32")],
                          reference=lambda x: (module(x),), samples={"s": (x,)})
    result = ExecuTorchExporter().export(component, "fp16", dest)
    (out,) = ExecuTorchRuntime().load(result.files, 1).run([x.half().numpy()])
    return result.details["delegate_subgraphs"], [snr_db(reference[0, r].numpy(), out[0, r].astype("float32")) for r in rows]


def test_fp16_rms_norm_lowers_into_one_partition_and_keeps_small_rows_exact(tmp_path):
    """fp16 RMSNorm divides each row by its peak (an `amax`, rewritten to XNNPACK's max pooling) so
    that its squares neither underflow on small rows nor overflow on large ones: rows at RMS 0.02 (an
    embedding's scale) and 200 both pass. Squaring x / (16 sqrt(n)) underflowed the small rows (-inf
    dB here); without the rewrite each `amax` (rank 3 and rank 4) splits the delegate."""
    torch.manual_seed(0)
    module = _RmsNormBlock().eval()
    with torch.no_grad():
        module.up.weight.mul_(0.1)
    x = torch.randn(1, 6, 64)
    x[0, :3] *= 0.02  # with up's weights scaled: rows at RMS ~0.01-0.02
    x[0, 3:] *= 400.0  # RMS ~200
    partitions, row_db = _fp16_pte_rows(module, x, tmp_path / "rms.pte", (slice(0, 3), slice(3, 6)))
    assert partitions == 1
    assert min(row_db) > 45, row_db


class _LayerNormBlock(nn.Module):
    """Linear -> torch LayerNorm over 1024 channels (as Qwen3-TTS Code2Wav's ConvNeXt blocks and
    SigLIP's layers use it), and over a [16, 16] trailing shape -> Linear."""

    def __init__(self):
        super().__init__()
        self.up, self.norm, self.down = nn.Linear(64, 1024), nn.LayerNorm(1024), nn.Linear(256, 64)
        self.square_norm = nn.LayerNorm((16, 16))
        with torch.no_grad():
            for norm in (self.norm, self.square_norm):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        h = self.norm(self.up(x) + 3.0)  # a mean far from 0 as well
        h = self.square_norm(h[..., :256].unflatten(-1, (16, 16))).flatten(-2)
        return self.down(h)


def test_fp16_layer_norm_stays_exact_on_wide_rows_and_lowers_into_one_partition(tmp_path):
    """ExecuTorch's portable `native_layer_norm` accumulates in fp16: before the exporter wrote
    LayerNorm out (`xnnpack_rewrites.norm_decompositions`), this block's 1024-channel rows at RMS 1
    came out at about -5 dB (40 dB and more now; eager fp16 scores about the same), and the
    norm ran outside the delegate, splitting it. Rows at RMS 300 and 0.001 check that the written-out norm neither overflows nor underflows fp16."""
    torch.manual_seed(0)
    module = _LayerNormBlock().eval()
    x = torch.randn(1, 9, 64) / 8  # up's outputs at RMS ~1
    x[0, 3:6] *= 300.0
    x[0, 6:] *= 0.001
    partitions, row_db = _fp16_pte_rows(module, x, tmp_path / "ln.pte", (slice(0, 3), slice(3, 6), slice(6, 9)))
    assert partitions == 1
    assert min(row_db) > 40, row_db


class _PackedProjection(nn.Module):
    """q, k, v from row slices of one packed weight, as `nn.MultiheadAttention` stores them."""

    def __init__(self):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(96, 32) / 32 ** 0.5), nn.Parameter(torch.randn(96))

    def forward(self, x):
        return tuple(nn.functional.linear(x, self.weight[i * 32:(i + 1) * 32], self.bias[i * 32:(i + 1) * 32]) for i in range(3))


def test_weight_slices_folded_into_constants_keep_their_own_rows(tmp_path):
    """Constant propagation folds `weight[32:64]` into a view of the packed weight; XNNPACK wrote a
    view from the start of its storage, so k and v ran with q's rows (ACT's .pte: -0.8 dB)."""
    torch.manual_seed(0)
    module = _PackedProjection().eval()
    x = torch.randn(6, 1, 32)
    with torch.no_grad():
        expected = module(x)
    component = Component("packed", "action", module, [TensorSpec("x", (6, 1, 32), "float32")],
                          [TensorSpec(n, (6, 1, 32), "float32") for n in "qkv"], reference=lambda x: module(x), samples={"s": (x,)})
    result = ExecuTorchExporter().export(component, "fp32", tmp_path / "packed.pte")
    outs = ExecuTorchRuntime().load(result.files, 1).run([x.numpy()])
    assert min(snr_db(e.numpy(), o) for e, o in zip(expected, outs)) >= 100.0



def test_an_example_input_that_is_a_transposed_view_gives_a_program_that_runs(tmp_path):
    """Qwen3-TTS's speaker encoder (the official ECAPA-TDNN at the tiny preset's widths) on example
    mels made as [1, bins, frames] and transposed, as the official mel spectrogram is (a view, not
    contiguous): ExecuTorch records the example's memory layout, and the program exported from it
    failed at execution on the contiguous buffers a runner passes (error 0x10)."""
    from edgex.recipes.qwen3_tts.models import speaker_encoder_module
    from edgex.recipes.qwen3_tts.presets import PRESETS

    torch.manual_seed(0)
    module = speaker_encoder_module(PRESETS["tiny"].speaker_encoder)
    mels = torch.randn(1, 128, 24).transpose(1, 2)
    assert not mels.is_contiguous()
    component = Component("speaker", "voice", module, [TensorSpec("mels", (1, 24, 128), "float32")],
                          [TensorSpec("embedding", (1, 64), "float32")], reference=lambda m: (module(m),), samples={"s": (mels,)})
    result = ExecuTorchExporter().export(component, "fp32", tmp_path / "speaker.pte")
    (out,) = ExecuTorchRuntime().load(result.files, 1).run([mels.numpy()])
    with torch.no_grad():
        assert snr_db(module(mels).numpy(), out) > 100
