"""What keeps a full-size export inside one machine (issue 16, export cost): the reference's outputs
on the example are not recomputed for parity, and the table read-back decodes only constants that
can be a table, from the file itself rather than from copies of it."""

from __future__ import annotations

import torch
from torch import nn

from edgex.component import Component, TensorSpec


def test_the_reference_outputs_the_recipe_computed_are_what_parity_reads():
    from edgex.recipes import RECIPES

    recipe = RECIPES.get("qwen3-tts")
    (comp,) = recipe.components(recipe.load("tiny", None, 0), ["talker_prefill"])  # prefill only: no eager frames
    first = next(iter(comp.samples))
    calls = []
    reference = comp.reference
    comp.reference = lambda *x: calls.append(1) or reference(*x)
    try:
        kept = comp.reference_outputs(first)
    finally:
        comp.reference = reference
    assert not calls  # kept from the recipe's own run, not recomputed
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(kept, reference(*comp.samples[first])))


class _Lookup(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.table = nn.Embedding(300, 32)
        self.proj = nn.Linear(32, 32)
        self.register_buffer("offset", torch.randn(5, 7))  # a constant no table can be

    def forward(self, ids):
        return (self.proj(self.table(ids)) + self.offset.sum(),)


def test_table_read_back_decodes_only_table_shaped_constants_from_the_file(tmp_path):
    """ONNX (external data) and .pte (constant segment, read through a memory map): the table comes
    back exact and row-scored, and constants no table can be are not decoded at all."""
    from edgex.exporters import EXPORTERS
    from edgex.parity.tensors import tensor_parity

    module = _Lookup().eval()
    ids = torch.tensor([[3, 7, 299]])
    comp = Component("lookup", "test", module, [TensorSpec("ids", (1, 3), "int64")], [TensorSpec("y", (1, 3, 32), "float32")],
                     lambda x: module(x), {"s": (ids,)}, tables={"table": module.table.weight})
    for name in ("onnx", "executorch"):
        exporter = EXPORTERS.get(name)
        files = exporter.export(comp, "fp32", tmp_path / f"lookup{exporter.extension}").files
        constants = exporter.stored_constants(comp, files, "fp32")
        assert {a.shape for a in constants.values()} == {(300, 32)}, (name, {k: a.shape for k, a in constants.items()})
        block = tensor_parity(exporter, comp, files, 60.0, "fp32")
        assert block["verdict"] == "pass" and block["tensors"]["table"]["snr_db"] == float("inf"), (name, block)
