"""A stand-in scheme reference for gate tests: the eager outputs plus noise at an exact level, so a
test sets the scheme's error to the dB it needs without quantizing anything."""

from __future__ import annotations

import math

import numpy as np
import torch

from edgex.component import Component


def noisy(outputs, db: float, seed: int) -> list[np.ndarray]:
    """Each output plus independent noise at exactly `db` below it (seeded per sample)."""
    rng = np.random.default_rng(seed + int(1e6 * abs(float(np.asarray(outputs[0]).reshape(-1)[0]))))
    result = []
    for out in outputs:
        out = np.asarray(out, np.float64)
        noise = rng.standard_normal(out.shape)
        noise *= math.sqrt(np.sum(out**2) / np.sum(noise**2) * 10 ** (-db / 10))
        result.append((out + noise).astype(np.float32))
    return result


class NoisyScheme:
    """A scheme reference whose outputs are fp32 eager's plus noise at `db`."""

    label = "toy scheme"

    def __init__(self, component: Component, db: float):
        self.component, self.db = component, db

    def __call__(self, inputs, forced=None):
        return tuple(torch.from_numpy(o) for o in noisy(self.component.eager(inputs), self.db, seed=1))

    def to_json(self):
        return {"source": self.label}
