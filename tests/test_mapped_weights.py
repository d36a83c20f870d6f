"""The export's weights live in a private file mapping: forked jobs map in only what they read."""

import threading
from dataclasses import dataclass

import psutil
import pytest
import torch
from torch import nn

from edgex.isolation import forking_supported, run_forked
from edgex import mapped_weights
from edgex.mapped_weights import map_weights

MB = 2**20


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(2048, 2048)  # 16 MB weight
        self.second = nn.Linear(2048, 2048)
        self.second.weight = self.first.weight
        self.register_buffer("table", torch.randn(1024, 1024))  # 4 MB
        self.register_buffer("rows", self.table[512:].t())  # a view: shares the table's storage
        self.register_buffer("small", torch.randn(4))


@dataclass
class _Models:
    tied: nn.Module
    other: nn.Module
    source: dict


def _rss_after_reading(tensors) -> float:
    torch.set_num_threads(1)
    before = psutil.Process().memory_info().rss
    for tensor in tensors:
        float(tensor.sum())
    return (psutil.Process().memory_info().rss - before) / MB


def test_mapped_weights_keep_values_identity_and_ties(tmp_path):
    torch.manual_seed(0)
    tied, other = _Tied(), nn.Linear(4096, 1024)
    models = _Models(tied, other, {})
    weight, x = tied.first.weight, torch.randn(3, 2048)
    expected = (tied.second(tied.first(x)), tied.table.clone(), other(torch.randn(1, 4096, generator=torch.Generator().manual_seed(1))))

    meanwhile = []
    moved = map_weights(models, tmp_path, meanwhile=lambda: meanwhile.append(threading.current_thread()))

    assert meanwhile == [threading.main_thread()]  # run once, in the calling thread, while the file was written
    assert moved >= (16 + 16 + 4) * MB  # the tied weight once, the other layer's weight, the table
    assert tied.first.weight is weight and tied.second.weight is tied.first.weight
    assert torch.equal(tied.second(tied.first(x)), expected[0])
    assert torch.equal(tied.table, expected[1])
    assert torch.equal(tied.rows, expected[1][512:].t()) and tied.rows.stride() == (1, 1024)
    assert tied.rows.data_ptr() == tied.table.data_ptr() + 512 * 1024 * 4  # still a view of the one copy
    assert torch.equal(other(torch.randn(1, 4096, generator=torch.Generator().manual_seed(1))), expected[2])
    assert tied.small.untyped_storage().nbytes() < MB  # small tensors stay where they were
    assert list(tmp_path.iterdir()) == []  # the file is unlinked once mapped


@pytest.mark.skipif(not forking_supported(), reason="needs fork")
def test_a_forked_job_maps_in_only_the_weights_it_reads(tmp_path):
    big = nn.Linear(8192, 4096, bias=False)  # 128 MB
    models = _Models(big, nn.Identity(), {})
    float(big.weight.sum())  # the parent has read them: inherited, they would count in a child at once
    anonymous = run_forked(_rss_after_reading, [big.weight])
    map_weights(models, tmp_path)
    float(big.weight.sum())
    mapped = run_forked(_rss_after_reading, [big.weight])
    # Inherited anonymous pages are resident in the child before it reads them; the few tens of MB
    # it may still add are the allocator's and the thread pool's, not the 128 MB weight.
    assert anonymous < 64, anonymous
    assert mapped > 100, mapped  # mapped: the child maps them in when it reads them
    assert mapped > anonymous + 64, (mapped, anonymous)


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), RuntimeError("unexpected pos 704 vs 598")])
def test_weights_stay_in_memory_where_the_file_cannot_be_written(tmp_path, monkeypatch, error):
    layer = nn.Linear(1024, 1024)
    weight = layer.weight.detach().clone()

    def full_disk(*_args, **_kwargs):
        raise error

    monkeypatch.setattr(mapped_weights, "_write_storages", full_disk)
    meanwhile = []
    assert map_weights(_Models(layer, nn.Identity(), {}), tmp_path, meanwhile=lambda: meanwhile.append(1)) == 0
    assert torch.equal(layer.weight, weight) and list(tmp_path.iterdir()) == [] and meanwhile == [1]
