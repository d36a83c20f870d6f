"""Reading gather tables back from an HTP context binary (`edgex.exporters.qnn_tables`): every
constant tried at once (`located_all`) finds what `located` finds one by one, without searching the
binary again for each constant stored in no row-contiguous form."""

from __future__ import annotations

import numpy as np

from edgex.exporters.qnn_tables import located, located_all, present


class _Counted(bytes):
    """A binary's bytes that count the searches made in them."""

    finds = 0

    def find(self, *args):
        type(self).finds += 1
        return super().find(*args)


def _binary(*parts: bytes) -> _Counted:
    rng = np.random.default_rng(1)
    return _Counted(b"".join(p for part in parts for p in (rng.bytes(4099), part)))


def test_all_tables_at_once_are_what_each_located_alone_finds_with_no_search_per_absent_constant():
    rng = np.random.default_rng(0)
    whole = rng.standard_normal((256, 64)).astype(np.float16)
    split = rng.integers(1, 2**16, (512, 64), dtype=np.uint16)
    halves = b"".join(np.ascontiguousarray(split[:, h * 32:(h + 1) * 32]).tobytes() + b"\0" * 512 for h in range(2))
    # stored column-major (no 16 values of a row lie together), as the HTP tiles a weight
    tiled = [rng.standard_normal((256, 1024)).astype(np.float16) for _ in range(3)]
    data = _binary(whole.tobytes(), halves, *(np.ascontiguousarray(t.T).tobytes() for t in tiled))
    tables = {"whole": whole, "split": split, **{f"tiled{i}": t for i, t in enumerate(tiled)}}
    alone = {k: located(data, t) for k, t in tables.items()}
    _Counted.finds = 0
    together = located_all(data, tables)
    assert np.array_equal(together["whole"], whole) and np.array_equal(together["split"], split)
    assert all(together[f"tiled{i}"] is None for i in range(3))
    assert list(together) == list(alone) and all(
        (a is None and b is None) or np.array_equal(a, b) for a, b in zip(alone.values(), together.values()))
    # `located` alone searches 9 probes x 7 block counts of each tiled table; here only the tables
    # found are searched again, by `located`
    finds = _Counted.finds
    assert finds == _finds_of_located(data, whole) + _finds_of_located(data, split), finds


def _finds_of_located(data: _Counted, raw) -> int:
    before = _Counted.finds
    located(data, raw)
    found = _Counted.finds - before
    _Counted.finds = before
    return found


def test_present_is_find_for_every_needle_at_any_offset():
    rng = np.random.default_rng(2)
    data = rng.bytes(100_000) + b"\0" * 4096 + rng.bytes(1000)
    needles = [data[i:i + n] for i, n in ((0, 32), (7, 32), (99_993, 16), (50_001, 3), (100_100, 32))]
    needles += [rng.bytes(32), b"\0" * 32, b"\0" * 7 + b"\1" * 25]
    expected = [data.find(n) >= 0 for n in needles]
    assert expected == [True] * 5 + [False, True, False]
    assert present(data, needles) == expected
    assert present(data, needles, chunk=1000, common=2) == expected  # chunk edges; zeros searched with find
