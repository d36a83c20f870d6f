"""How a Ray build splits its jobs into tasks (`edgex.build.executors.batches`): one task per model
per node, each model's jobs balanced over the nodes, the CPUs a task asks for what it runs side by
side, its memory that of its largest job."""

from __future__ import annotations

from pathlib import Path

from edgex.build.executors.batches import Node, plan_batches
from edgex.build.executors.memory import demand
from edgex.build.executors.pending import Pending
from edgex.build.shard import Recorded
from edgex.build.spec import load_plan

PLAN = """
[[entry]]
model = "qwen3-tts"
targets = ["cpu", "llama-cpp"]

[[entry]]
model = "spark-x2.5"
targets = ["cpu"]
components = ["decode"]
formats = ["onnx"]
"""


def pending(tmp_path: Path) -> list[Pending]:
    file = tmp_path / "plan.toml"
    file.write_text(PLAN)
    return [Pending(i, job, f"{i:064x}", {}) for i, job in enumerate(load_plan(file).jobs)]


def test_each_model_is_one_task_per_node_balanced_and_rotated(tmp_path):
    items = pending(tmp_path)
    demands = {p.index: demand(p.job, {}) for p in items}
    nodes = [Node("b", 4), Node("a", 2)]
    batches = plan_batches(items, demands, nodes, Recorded())
    qwen = [b for b in batches if b.items[0].job.model == "qwen3-tts"]
    spark = [b for b in batches if b.items[0].job.model == "spark-x2.5"]
    # every job once, in a task of its own model; qwen3-tts's many jobs on both nodes, spark's two
    # jobs too, starting from the other node
    assert sorted(p.index for b in batches for p in b.items) == [p.index for p in items]
    assert [b.node.node_id for b in qwen] == ["a", "b"] and [b.node.node_id for b in spark] == ["b", "a"]
    assert all(len({p.job.model for p in b.items}) == 1 for b in batches)
    # balanced by expected cost: the halves differ by at most one job's default cost (60 s)
    from edgex.build.shard import expected_cost

    loads = [sum(expected_cost(p.job, Recorded()) for p in b.items) for b in qwen]
    assert abs(loads[0] - loads[1]) <= 60
    # side by side: as many CPUs as the node has, or as its jobs use; the largest job's memory
    assert [b.cpus for b in qwen] == [2, 4] and [b.cpus for b in spark] == [1, 1]
    for b in batches:
        assert b.memory == max(demands[p.index].memory for p in b.items)


def test_a_model_with_fewer_jobs_than_nodes_takes_as_many_nodes_as_jobs(tmp_path):
    items = [p for p in pending(tmp_path) if p.job.model == "spark-x2.5"]
    demands = {p.index: demand(p.job, {}) for p in items}
    batches = plan_batches(items, demands, [Node(n, 1) for n in "abcd"], Recorded())
    assert len(batches) == len(items) and len({b.node.node_id for b in batches}) == len(items)
