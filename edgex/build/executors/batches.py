"""Which jobs each Ray task runs: one task per model per node, so that each node builds each eager
model once and runs that model's jobs side by side, as a local build does.

The jobs of one model (recipe, weights, seed, build options) are split into as many batches as
there are live nodes (fewer when the model has fewer jobs), balanced by expected cost
(`edgex.build.shard.partition`: the seconds the build cache records for each job, else a default
per exporter), and batch i is placed on node i (counted from a different node for each model, so
that models with few jobs do not all start on the first node). A placement is a preference: a batch
whose node is lost or full may run on another (`soft` node affinity). A batch asks for as many CPUs
as it runs jobs side by side (its jobs' threads, at most the node's CPUs), and for the memory of its
largest job (`edgex.build.executors.memory`): the batch's process keeps its own budget, as
`edgex export` does, for the jobs beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..shard import Recorded, partition
from .memory import Demand
from .pending import Pending


@dataclass(frozen=True)
class Node:
    node_id: str
    cpus: int


@dataclass(frozen=True)
class Batch:
    node: Node
    items: list[Pending]
    cpus: int  # jobs side by side, and the CPUs the task asks for
    memory: int  # bytes

    def describe(self) -> str:
        return f"{len(self.items)} job(s), {self.cpus} CPU, {self.memory / 2**30:.1f} GiB memory"


def source_of(item: Pending) -> tuple:
    job = item.job
    return job.model, job.preset, job.checkpoint, job.seed, job.settings


def plan_batches(pending: list[Pending], demands: dict[int, Demand], nodes: list[Node], recorded: Recorded) -> list[Batch]:
    """The batches, models in plan order (the first job of each), each model's split over the nodes."""
    groups: dict[tuple, list[Pending]] = {}
    for item in pending:
        groups.setdefault(source_of(item), []).append(item)
    nodes = sorted(nodes, key=lambda n: n.node_id)
    batches = []
    for g, items in enumerate(groups.values()):
        count = min(len(nodes), len(items))
        by_id = {item.job.id: item for item in items}
        parts = partition([item.job for item in items], count, recorded)
        for b, part in enumerate(parts):
            members = [by_id[job.id] for job in part]
            node = nodes[(g + b) % len(nodes)]
            cpus = max(1, min(node.cpus, sum(demands[m.index].cpus for m in members)))
            batches.append(Batch(node, members, cpus, max(demands[m.index].memory for m in members)))
    return batches
