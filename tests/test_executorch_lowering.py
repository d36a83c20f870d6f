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
