"""What every executor is handed: the jobs the build cache does not hold."""

from __future__ import annotations

from dataclasses import dataclass

from ..spec import BuildJob


@dataclass(frozen=True)
class Pending:
    """A job the cache does not hold: its plan index, its cache key and what the key digests."""

    index: int
    job: BuildJob
    key: str
    inputs: dict
