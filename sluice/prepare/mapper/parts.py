"""What every map worker writes: R partition files, problems kept with their task and line.

The partition files are local spill files; one that cannot be written is a SpillError, the
worker's failure and never the input's.
"""

from __future__ import annotations

import contextlib
import os
import zlib
from collections.abc import Sequence
from typing import BinaryIO

from sluice.contracts.prepare import PrepareProblem
from sluice.errors import MAX_REASONS, SluiceError
from sluice.input.sources import Problems
from sluice.shards import ShardWriter


def partitions_of(pairs: Sequence[tuple[str, str]], partitions: int) -> list[int]:
    """The dedup partition of each (bucket, key): equal keys always meet in the same reduce worker."""
    # CRC-32 of "bucket/key" (a bucket name has no "/"): stable across processes and retries,
    # unlike hash(); as even as a random assignment on realistic and sequential keys (within 1-8%
    # of the mean at 3..512 partitions), and a third of BLAKE2b's cost, which is most of a map
    # worker's per-key work. One comprehension over a batch: a Python call per key costs as much.
    return [zlib.crc32(f"{b}/{k}".encode("utf-8", "surrogatepass")) % partitions for b, k in pairs]


WHERE = "\0"  # stands for "<name> line <n>" in a reason; collect() writes the global line there


FLUSH_BUDGET = 262_144  # keys buffered over all partitions before they are written as blocks


PART_BLOCK_KEYS = 4096


class SpillError(SluiceError):
    """A map worker cannot write its local part files (a full disk, an unwritable spill directory).

    Never the input's fault, so never a rejection: the map job exits 1 and Batch retries it
    (prepare_retry_strategy); the message names the file and the system's reason.
    """


def spill_error(path: str, exc: OSError) -> SpillError:
    """The SpillError for an OSError met writing `path`."""
    return SpillError(
        f"cannot write the spill file {path}: {exc.strerror or exc} (errno {exc.errno}): the map worker needs "
        "free space in a writable SLUICE_SPILL_DIR (or the system's temporary directory); Batch retries the job"
    )


class TaskProblems(Problems):
    """sluice.input.sources.Problems that never stops the scan: keeps MAX_REASONS, counts all, tags task and line."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[PrepareProblem] = []
        self.task = 0
        self.line: int | None = None

    def add(self, reason: str) -> None:
        self.count += 1
        if len(self.kept) >= MAX_REASONS:
            return
        if reason.startswith(WHERE):
            self.kept.append(
                PrepareProblem(task=self.task, line=self.line, reason=reason[len(WHERE) :].removeprefix(": "))
            )
        else:
            self.kept.append(PrepareProblem(task=self.task, line=None, reason=reason))


class Parts:
    """R spill files in the shard format; keys buffered per partition and bucket, written in blocks.

    Any OSError writing them is a SpillError naming the file.
    """

    def __init__(self, directory: str, partitions: int) -> None:
        self.paths = [os.path.join(directory, f"{r}.part") for r in range(partitions)]
        self._files: list[BinaryIO] = []
        self._writers: list[ShardWriter] = []
        for p in self.paths:
            try:
                self._files.append(open(p, "wb"))  # noqa: SIM115 - closed in close() or abort()
                self._writers.append(ShardWriter(self._files[-1], sort=False, level=1, block_keys=PART_BLOCK_KEYS))
            except OSError as exc:
                self.abort()
                raise spill_error(p, exc) from exc
        self._buf: list[dict[str, list[str]]] = [{} for _ in range(partitions)]
        self._held = [0] * partitions
        self._flush_at = max(256, FLUSH_BUDGET // partitions)
        self.counts = [0] * partitions
        self._r = partitions

    def add(self, pairs: list[tuple[str, str]], routes: list[int] | None = None) -> None:
        """Route a batch of valid (bucket, key) pairs to their partitions (`routes`: given, one per pair)."""
        bufs, held = self._buf, self._held
        for (bucket, key), r in zip(pairs, partitions_of(pairs, self._r) if routes is None else routes, strict=True):
            buf = bufs[r]
            keys = buf.get(bucket)
            if keys is None:
                keys = buf[bucket] = []
            keys.append(key)
            held[r] += 1
        for r, n in enumerate(held):
            if n >= self._flush_at:
                self._flush(r)

    def _flush(self, r: int) -> None:
        writer = self._writers[r]
        try:
            for bucket, keys in self._buf[r].items():
                writer.add(bucket, keys)
                self.counts[r] += len(keys)
        except OSError as exc:
            raise spill_error(self.paths[r], exc) from exc
        self._buf[r] = {}
        self._held[r] = 0

    def close(self) -> None:
        for r, writer in enumerate(self._writers):
            self._flush(r)
            try:
                writer.close()
                self._files[r].close()
            except OSError as exc:
                raise spill_error(self.paths[r], exc) from exc

    def abort(self) -> None:
        for f in self._files:
            with contextlib.suppress(OSError):  # a full disk fails the flush in close(): the file is discarded
                f.close()


Version = tuple[str, str | None]  # (ETag, version id) of an object as the input names it
