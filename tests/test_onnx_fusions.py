"""ONNX Runtime-only rewrites (`edgex/exporters/onnx_fusions.py`): a fused graph computes what the
unfused one does, and a pattern that only looks like NeoX RoPE is left alone."""

from __future__ import annotations

import numpy as np
import torch

from edgex.exporters.onnx import optimize
from edgex.exporters.onnx_fusions import fuse_for_onnxruntime
import pytest

from edgex.nn.transformer import apply_rope, register_rope, rope_cos_sin, rope_table

HEADS, POSITIONS, DIM, BOUND = 2, 3, 8, 16


class Rope(torch.nn.Module):
    """q rotated at the positions given, as the graphs rotate it: rows of a stored table (`bound`
    positions) or, with no bound, angles computed in the graph; `skew` scales the second half of
    the angles, a table RotaryEmbedding cannot express (its halves differ)."""

    def __init__(self, skew: float = 1.0, bound: int | None = BOUND):
        super().__init__()
        inv_freq = 1.0 / 10000 ** (torch.arange(0, DIM, 2).float() / DIM)
        register_rope(self, "rope", inv_freq, bound)
        if skew != 1.0 and bound is not None:
            cos, sin = rope_table(inv_freq * skew, bound)
            self.rope_cos[:, DIM // 2:], self.rope_sin[:, DIM // 2:] = cos[:, DIM // 2:], sin[:, DIM // 2:]
        self.register_buffer("inv_freq", inv_freq)
        self.skew, self.bound = skew, bound

    def forward(self, q, position):
        positions = position + torch.arange(POSITIONS)
        if self.skew == 1.0 or self.bound is not None:
            cos, sin = rope_cos_sin(self, "rope", positions, torch.float32)
        else:
            freqs = positions.float()[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs * self.skew), dim=-1)
            cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        return apply_rope(q, cos, sin)



def _fused(module: torch.nn.Module, tmp_path, name: str):
    import onnxruntime as ort

    q, position = torch.randn(1, HEADS, POSITIONS, DIM), torch.tensor([5])
    program = torch.onnx.export(module, (q, position), dynamo=True, input_names=["q", "position"], optimize=False, verbose=False)
    optimize(program.model)
    plain = tmp_path / f"{name}.plain.onnx"
    program.save(str(plain))
    counts = fuse_for_onnxruntime(program.model)
    fused = tmp_path / f"{name}.fused.onnx"
    program.save(str(fused))
    feed = {"q": q.numpy(), "position": position.numpy()}
    run = lambda path: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feed)[0]  # noqa: E731
    ops = {n.op_type for n in program.model_proto.graph.node}
    return counts, ops, run(plain), run(fused), module(q, position).numpy()


@pytest.mark.parametrize("bound", [BOUND, None])
def test_neox_rope_becomes_one_rotary_embedding_with_the_same_values(tmp_path, bound):
    """Table rows gathered at the graph's positions, or angles computed in the graph."""
    counts, ops, plain, fused, eager = _fused(Rope(bound=bound), tmp_path, "rope")
    assert counts.get("fused_rotary_embeddings") == 1 and "RotaryEmbedding" in ops and "Neg" not in ops
    assert ("Cos" in ops) == (bound is None)  # a table's graph computes no angle
    np.testing.assert_allclose(plain, eager, atol=1e-5)
    np.testing.assert_allclose(fused, plain, atol=1e-5)


@pytest.mark.parametrize("bound", [BOUND, None])
def test_a_table_with_unequal_halves_is_not_fused(tmp_path, bound):
    """RotaryEmbedding applies one angle to both halves: a table whose halves differ matches the
    node pattern but must stay as it is (fusing it would rotate the second half wrongly)."""
    counts, ops, plain, fused, eager = _fused(Rope(skew=2.0, bound=bound), tmp_path, "skewed")
    assert "fused_rotary_embeddings" not in counts and "RotaryEmbedding" not in ops and "Neg" in ops
    np.testing.assert_allclose(fused, eager, atol=1e-5)
