"""A host-side runner over the prefill and decode graphs, written the way a device runner is:
prefill whole chunks, decode the rest one token at a time, feed the returned ring back, write
the full layers' new entries at their positions. Graphs are any callables on numpy arrays
(a runtime session's `run`, or `numpy_callable(module)` for the eager wrappers)."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

Graph = Callable[[Sequence[np.ndarray]], list]


def numpy_callable(module: torch.nn.Module) -> Graph:
    def run(inputs):
        with torch.no_grad():
            return [t.numpy() for t in module(*[torch.from_numpy(np.ascontiguousarray(x)) for x in inputs])]

    return run


class CacheRunner:
    def __init__(self, prefill: Graph, decode: Graph, state: Sequence[np.ndarray], chunk: int):
        self.prefill, self.decode, self.chunk = prefill, decode, chunk
        self.ring_key, self.ring_value, self.past_key, self.past_value = (np.array(s, copy=True) for s in state)
        self.position = 0

    def _call(self, graph: Graph, tokens: np.ndarray) -> np.ndarray:
        n = tokens.shape[0]
        if self.position + n > self.past_key.shape[3]:
            raise ValueError(f"context of {self.past_key.shape[3]} slots is full")
        logits, self.ring_key, self.ring_value, key, value = graph(
            [tokens[None].astype(np.int64), np.array([self.position], np.int64),
             self.ring_key, self.ring_value, self.past_key, self.past_value])
        self.past_key[:, :, :, self.position : self.position + n] = key
        self.past_value[:, :, :, self.position : self.position + n] = value
        self.position += n
        return np.asarray(logits)[0]

    def feed(self, tokens: np.ndarray) -> np.ndarray:
        """Logits [len(tokens), vocab] for tokens appended at the current position."""
        out, i = [], 0
        while len(tokens) - i >= self.chunk:
            out.append(self._call(self.prefill, tokens[i : i + self.chunk]))
            i += self.chunk
        out += [self._call(self.decode, tokens[j : j + 1]) for j in range(i, len(tokens))]
        return np.concatenate(out)

    def greedy(self, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
        logits = self.feed(prompt)
        tokens = []
        for _ in range(new_tokens):
            tokens.append(int(np.argmax(logits[-1])))
            logits = self.feed(np.array(tokens[-1:]))
        return np.array(tokens)
