"""Batch buffers a loader fills and its rank reads: (B, H, W, 3) uint8 arrays.

Thread loaders use plain numpy arrays. Process loaders use one POSIX shared-memory segment
per loader (/dev/shm: the job definition must raise sharedMemorySize, see docs/worker.md);
the rank creates it, the loader attaches by name, the rank unlinks it at the end.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np

from gpu_worker.decode.preprocess import Preprocess, legacy


@dataclass(frozen=True)
class BufferSpec:
    """Enough to attach to a loader's buffers from another process."""

    shm_name: str | None  # None: in-process arrays
    count: int
    batch_size: int
    image_size: int
    prep: Preprocess | None = None  # how the loader decodes into them; None: the legacy preprocessing at image_size

    @property
    def preprocess(self) -> Preprocess:
        """How images are decoded into these buffers."""
        return self.prep if self.prep is not None else legacy(self.image_size)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.count, self.batch_size, self.image_size, self.image_size * 3)

    @property
    def nbytes(self) -> int:
        c, b, h, w3 = self.shape
        return c * b * h * w3


class BufferSet:
    """`count` batch buffers; `array(i)` is buffer i as (B, H, W, 3) uint8."""

    def __init__(self, spec: BufferSpec, *, create: bool) -> None:
        self.spec = spec
        self._shm: shared_memory.SharedMemory | None = None
        if spec.shm_name is None:
            data = np.zeros(spec.nbytes, dtype=np.uint8)
        else:
            if create:
                with contextlib.suppress(FileNotFoundError):  # a stale segment from a killed run
                    shared_memory.SharedMemory(name=spec.shm_name).unlink()
                self._shm = shared_memory.SharedMemory(name=spec.shm_name, create=True, size=spec.nbytes)
            else:
                self._shm = shared_memory.SharedMemory(name=spec.shm_name)
            data = np.ndarray((spec.nbytes,), dtype=np.uint8, buffer=self._shm.buf)
        s = spec.image_size
        self._all = data.reshape(spec.count, spec.batch_size, s, s, 3)

    def array(self, i: int) -> np.ndarray:
        return self._all[i]

    def close(self, *, unlink: bool = False) -> None:
        self._all = np.zeros((0, 0, 0, 0, 3), dtype=np.uint8)  # drop views before closing the mapping
        if self._shm is not None:
            with contextlib.suppress(BufferError):
                self._shm.close()
            if unlink:
                with contextlib.suppress(FileNotFoundError):
                    self._shm.unlink()
            self._shm = None
