"""Gather tables read back from an HTP context binary: located by their rows' bytes, whole or in
column blocks, as the HTP stores them (fp16, or the QDQ graph's integers; a table a scalar
multiplies after the gather stored already multiplied)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def context_binary(ctx: Path) -> Path:
    """The `.bin` an EPContext model points at (its `ep_cache_context` attribute)."""
    import onnx

    model = onnx.load(str(ctx), load_external_data=False)
    names = {onnx.helper.get_attribute_value(a).decode() for n in model.graph.node if n.op_type == "EPContext"
             for a in n.attribute if a.name == "ep_cache_context"}
    if len(names) != 1:
        raise RuntimeError(f"expected one QNN context binary, the EPContext model names {len(names)}: whole graph not on the HTP?")
    return ctx.parent / names.pop()


def dequantize(q, *, scale, zero, axis: int):
    """ONNX DequantizeLinear: (q - zero) * scale, per tensor or along `axis`."""
    import numpy as np

    if np.ndim(scale) == 1 and np.size(scale) > 1:
        shape = [1] * q.ndim
        shape[axis] = -1
        scale, zero = scale.reshape(shape), np.reshape(zero, shape) if np.size(zero) > 1 else zero
    return ((q.astype(np.float32) - zero) * scale).astype(np.float32)


def gathered_then_scaled(model, inits: dict) -> list[tuple[str, float]]:
    """(table, factor) for each float table a Gather reads whose rows are then multiplied by a
    scalar constant (a token embedding times sqrt(hidden)): the HTP's fp16 graph stores that table
    already multiplied (measured: two VLAs' prefix graphs, `embed_tokens` x 8 on the tiny
    preset, rows contiguous in fp16), so it is looked for that way too."""
    import numpy as np
    from onnx import numpy_helper

    scalars = {n: float(a.reshape(-1)[0]) for n, a in inits.items() if a.size == 1 and a.dtype.kind == "f"}
    scalars |= {n.output[0]: float(numpy_helper.to_array(n.attribute[0].t).reshape(-1)[0]) for n in model.graph.node
                if n.op_type == "Constant" and n.attribute[0].name == "value" and np.prod(n.attribute[0].t.dims) == 1
                and n.attribute[0].t.data_type in (1, 10)}
    gathered = {n.output[0]: n.input[0] for n in model.graph.node
                if n.op_type == "Gather" and n.input[0] in inits and inits[n.input[0]].dtype.kind == "f"}
    found = []
    for node in model.graph.node:
        if node.op_type == "Mul" and len(node.input) == 2:
            for table, factor in ((node.input[0], node.input[1]), (node.input[1], node.input[0])):
                if table in gathered and factor in scalars and scalars[factor] not in (0.0, 1.0):
                    found.append((gathered[table], scalars[factor]))
    return found


def located(data: bytes, raw) -> "np.ndarray | None":
    """The 2-D `raw` as `data` stores it, rows contiguous, whole or split into column blocks: each
    block of a layout of `_column_layouts` is located on its own (`_located_block`) and the table
    read back from where its blocks are. The HTP splits some tables so (measured: a tiny LLM decode
    graph's w8a16 embedding, uint16 [131072, 64], stored as two [131072, 32] blocks of 8 MiB, row i
    of each at its block's start + i * 64 bytes, 512 bytes between the blocks; a 450m robot policy's fp16
    token embedding [49280, 960], times sqrt(960), as blocks of 256 columns and a last one of 192).
    None where some block is not found (e.g. tiled)."""
    import numpy as np

    for layout in _column_layouts(raw.shape[1]):
        parts = []
        for start, stop in layout:
            part = _located_block(data, np.ascontiguousarray(raw[:, start:stop]))
            if part is None:
                break
            parts.append(part)
        else:
            return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
    return None


def _column_layouts(width: int, least: int = 16) -> list[list[tuple[int, int]]]:
    """The column blocks a table of `width` columns is looked for in, as [start, stop) ranges: the
    equal splits of `_column_blocks`, then blocks of each power-of-two width (at least `least`), the
    rest of the columns in a narrower last block."""
    layouts = [[(b * (width // n), (b + 1) * (width // n)) for b in range(n)] for n in _column_blocks(width, least)]
    block = 1 << (width - 1).bit_length() - 1 if width > 1 else 0
    while block >= least:
        layout = [(start, min(start + block, width)) for start in range(0, width, block)]
        if layout not in layouts:
            layouts.append(layout)
        block //= 2
    return layouts


def _column_blocks(width: int, least: int = 16) -> list[int]:
    """How many equal column blocks a table of `width` columns is looked for in: 1, then 2, 4, ...
    while a block keeps at least `least` values (16 bytes of 8-bit codes: a shorter probe matches
    by chance)."""
    counts, n = [], 1
    while width % n == 0 and width // n >= least:
        counts.append(n)
        n *= 2
    return counts or [1]


def _probes(rows: int):
    """The rows whose bytes `_located_block` searches, in order: up to 64, spread over the table."""
    import numpy as np

    return np.unique(np.linspace(0, rows - 1, 64).astype(int))


def located_all(data: bytes, tables: dict) -> dict:
    """`located(data, raw)` for each of `tables` (key -> 2-D array), the same results. `located`
    gives up on a table when none of the first 9 probe rows of its narrowest first column block is
    in `data` (a wider first block holds that block's bytes at its start, so its probes are not there
    either, and each try stops after 9 probes, none found): those probes of every table are looked
    for at once (`present`), and `located` runs only for the tables some probe was found for. Most
    constants tried are weights the HTP tiles, found in none: 401 of the 0.6b predictor frame, each
    9 searches of its 294 MB binary at 0.1 s, 7 times over (one per block count) in `located`."""
    import numpy as np

    probes = {}
    for key, raw in tables.items():
        narrowest = raw[:, : min(stop - start for (start, stop), *_ in _column_layouts(raw.shape[1]))]
        probes[key] = [np.ascontiguousarray(narrowest[i]).tobytes() for i in _probes(raw.shape[0])[:9]]
    needles = [n for ns in probes.values() for n in ns]
    found = iter(present(data, needles))
    some = {key: any([next(found) for _ in ns]) for key, ns in probes.items()}
    return {key: located(data, raw) if some[key] else None for key, raw in tables.items()}


def present(data: bytes, needles: list[bytes], chunk: int = 1 << 22, common: int = 64) -> list[bool]:
    """Whether each needle occurs in `data` at any offset (`data.find(needle) >= 0`), for all of them
    in 8 passes over `data`: its 8-byte words at each byte offset are matched against the needles'
    first 8 bytes (sorted, `searchsorted`), and each match is compared in full. A needle shorter than
    8 bytes, or whose first 8 bytes are common in `data` (more than `common` matches in one chunk:
    zeros), is searched with `find`."""
    import numpy as np

    out = [False] * len(needles)
    by_key: dict[int, list[int]] = {}
    searched = []
    for i, needle in enumerate(needles):
        if len(needle) < 8:
            searched.append(i)
        else:
            by_key.setdefault(int.from_bytes(needle[:8], "little"), []).append(i)
    keys = np.array(sorted(by_key), dtype=np.uint64)
    frequent: set[int] = set()
    for offset in range(8 if len(keys) else 0):
        count = (len(data) - offset) // 8
        if count <= 0:
            continue
        words = np.frombuffer(data, np.uint64, count, offset)
        for start in range(0, count, chunk):
            part = words[start:start + chunk]
            at = np.minimum(np.searchsorted(keys, part), len(keys) - 1)
            hits = np.flatnonzero(keys[at] == part)
            values, counts = np.unique(part[hits], return_counts=True)
            frequent.update(int(v) for v, c in zip(values, counts) if c > common)
            for h in hits:
                key = int(part[h])
                if key in frequent:
                    continue
                pos = offset + 8 * (start + int(h))
                for i in by_key[key]:
                    if not out[i] and data[pos:pos + len(needles[i])] == needles[i]:
                        out[i] = True
    searched += [i for key in frequent for i in by_key[key]]
    for i in searched:
        out[i] = out[i] or data.find(needles[i]) >= 0
    return out


def _located_block(data: bytes, raw) -> "np.ndarray | None":
    """The 2-D `raw` as `data` stores it, rows contiguous: the rows' bytes are searched at up to 64
    places, and the start most found rows agree on (row i at start + i * row bytes) is read back.
    None where 8 probes spread over the rows find none (not stored so, e.g. tiled)."""
    import numpy as np
    from collections import Counter

    rows, row_bytes = raw.shape[0], raw[0].nbytes
    starts: Counter = Counter()
    for n, i in enumerate(_probes(rows)):
        at = data.find(np.ascontiguousarray(raw[i]).tobytes())
        if at >= 0:
            starts[at - i * row_bytes] += 1
        elif n >= 8 and not starts:
            return None
    if not starts:
        return None
    start = starts.most_common(1)[0][0]
    if start < 0 or start + raw.nbytes > len(data):
        return None
    return np.frombuffer(data, raw.dtype, raw.size, start).reshape(raw.shape)
