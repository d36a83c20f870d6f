"""What keeps a full-size export inside one machine (issue 16, export cost): the eager utterances
the samples come from are generated as one batch, the reference's outputs on the example are not
recomputed for parity, and the table read-back decodes only constants that can be a table, from
the file itself rather than from copies of it."""

from __future__ import annotations

import torch
from torch import nn

from edgex.component import Component, TensorSpec
from edgex.parity.metrics import snr_db


def test_utterances_generated_together_draw_and_compute_what_each_draws_alone(tiny):
    """Each row of a batch consumes its own generator's draws in its own order (noise equal bit for
    bit) and computes what the utterance generated alone computes, to rounding (kernels block a
    2-row matmul differently); the first frame's codes agree."""
    from edgex.recipes.qwen3_tts.pipeline import Utterance, Utterances

    loaded, _ = tiny
    talker, prefill = loaded.models.talker, loaded.options["prefill_len"]
    pair = Utterances(talker, prefill, 3, [11, 12])
    for row, seed in enumerate((11, 12)):
        alone, batched = Utterance(talker, prefill, 3, seed), pair.row(row)
        assert snr_db(alone.prefill_embeds.numpy(), batched.prefill_embeds.numpy()) > 100
        for f in range(3):
            x, y = alone.frame(f), batched.frame(f)
            assert torch.equal(x["noise"], y["noise"]) and torch.equal(x["code0_noise"], y["code0_noise"])
            assert snr_db(x["next_embeds"].numpy(), y["next_embeds"].numpy()) > 100
        assert torch.equal(alone.frame(0)["codes"], batched.frame(0)["codes"])
        key, _ = batched.cache(prefill + 2)
        assert key.shape[1] == 1 and snr_db(alone.cache(prefill + 2)[0].numpy(), key.numpy()) > 100


def test_a_component_built_alone_gets_the_samples_it_gets_built_with_others(tiny):
    """Utterances a and b are always generated as the same pair, so `edgex verify` and the build
    cache, which build one component at a time, score on the samples the export scored on."""
    from edgex.recipes import RECIPES

    loaded, together = tiny
    recipe = RECIPES.get("qwen3-tts")
    (alone,) = recipe.components(recipe.load("tiny", None, 0), ["talker_decode"])
    for name, inputs in alone.samples.items():
        assert all(torch.equal(a, b) for a, b in zip(inputs, together["talker_decode"].samples[name]))


def test_the_reference_outputs_the_recipe_computed_are_what_parity_reads(tiny):
    _, components = tiny
    comp = components["talker_decode"]
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
