"""Content kinds other than images (docs/kinds.md): each object becomes parts, each part one output row.

A kind's embedder (`Embedder`) turns one object's bytes into parts (`split`, in the fetch
threads: decode, chunk or sample) and a list of parts' payloads into unit-norm embeddings
(`embed`, on the rank's device); gpu_worker.kinds.parts runs them for a rank. Images keep
their own pipeline (gpu_worker.loader, shared-memory batches).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpu_worker.errors import ConfigError
from sluice.models import ContentSpec, PlannedModel


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


class Embedder(Protocol):
    info: PartsInfo
    output_dim: int

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


def load_embedder(how: Loading) -> Embedder:
    """The embedder of one model for the run's kind."""
    kind = how.content.kind
    if kind == "text":
        from gpu_worker.kinds.textmodel import load_text

        return load_text(how)
    raise ConfigError(f"input.kind {kind!r} has no embedder in this worker (kinds: image, text)")
