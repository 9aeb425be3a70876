"""What every kind's embedder shares: its parts, its info, what loading it needs (gpu_worker.kinds)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpu_worker.config import WorkerConfig
from sluice.contracts.plan import PlannedModel
from sluice.contracts.sections import ContentSpec


@dataclass(frozen=True)
class PartsInfo:
    """What the sinks and logs need to know of a model: its name and spec version."""

    name: str
    version: str = ""


@dataclass(frozen=True)
class Part:
    """One part of one object: its index, where it starts and ends (characters or seconds), its payload."""

    part: int
    start: float
    end: float
    payload: Any
    note: str = ""  # on an object's first part: what went wrong in a partly damaged one (kept, logged)


class Embedder(Protocol):
    info: PartsInfo
    output_dim: int
    sort_batches: int  # batches of parts gathered per embed call (a text model sorts them by length)

    def split(self, data: bytes) -> list[Part]:
        """One object's parts; ObjectFailure when its bytes are not of the kind."""
        ...

    def embed(self, payloads: Sequence[Any]) -> np.ndarray:
        """(len(payloads), output_dim) float32 unit vectors."""
        ...


@dataclass(frozen=True)
class Loading:
    """What loading one model of a run needs: its local file, its plan entry, the run's content, where it runs."""

    path: str
    planned: PlannedModel
    content: ContentSpec
    device: str
    batch: int
    cfg: WorkerConfig
