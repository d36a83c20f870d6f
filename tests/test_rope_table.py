"""The decode graphs read RoPE as rows of a cos / sin table gathered at their position, never as an
angle computed in the graph: a runtime that runs a graph in fp16 computes position x frequency in
fp16, whose error grows with the position (docs/precisions.md). The table covers exactly the
positions the graph declares (its KV slots), so a position beyond them is an error, not a wrap."""

from __future__ import annotations

import pytest
import torch

from edgex.nn.transformer import rope_inv_freq, rope_table
from edgex.recipes import RECIPES


def _gathered_tables(module, inputs) -> list[tuple[int, ...]]:
    """The shapes of the tables the exported graph gathers rows of; fails on any trigonometry."""
    program = torch.export.export(module.eval(), inputs, strict=False)
    calls = [n for n in program.graph.nodes if n.op == "call_function"]
    trig = sorted({str(n.target) for n in calls if "cos" in str(n.target) or "sin" in str(n.target)})
    assert not trig, f"the graph computes its RoPE angles: {trig}"
    return [tuple(n.args[0].meta["val"].shape) for n in calls if n.target == torch.ops.aten.index_select.default]


def test_a_talker_decode_graph_gathers_its_rope_from_a_table_over_its_slots():
    from edgex.recipes.qwen3_tts.talker import TalkerDecode

    talker = RECIPES.get("qwen3-tts").load("tiny", None, 0).models.talker
    cfg, slots = talker.config, 96
    graph = TalkerDecode(talker, slots)
    past = torch.zeros(cfg.num_hidden_layers, 1, cfg.num_key_value_heads, slots, cfg.head_dim)
    inputs = (torch.randn(1, 1, cfg.hidden_size), torch.tensor([slots - 1]), past, past.clone())
    assert _gathered_tables(graph, inputs).count((slots, cfg.head_dim)) == 2  # cos and sin
    cos, sin = rope_table(rope_inv_freq(cfg), slots)
    assert torch.equal(graph.rope_cos, cos) and torch.equal(graph.rope_sin, sin)
    angle = (slots - 1) * rope_inv_freq(cfg)[0].double()  # the fastest pair at the last slot, in float64
    assert float(graph.rope_cos[slots - 1, 0]) == pytest.approx(float(torch.cos(angle)), abs=1e-7)
    with torch.no_grad(), pytest.raises((IndexError, RuntimeError)):
        graph(inputs[0], torch.tensor([slots]), *inputs[2:])


def test_a_spark_decode_graph_gathers_both_layer_types_rope_from_tables_over_its_context():
    from edgex.recipes.spark_x25.graphs import SparkDecode, empty_state

    model = RECIPES.get("spark-x2.5").load("tiny", None, 0).models
    cfg, context = model.config, 40
    graph = SparkDecode(model, context)
    inputs = (torch.tensor([[3]]), torch.tensor([context - 1]), *empty_state(cfg, context))
    rotary = int(cfg.head_dim * cfg.full_partial_rotary_factor)
    assert {(context, cfg.head_dim), (context, rotary)} <= set(_gathered_tables(graph, inputs))
