"""Where a map worker's keys go: problems kept with their task and line, the filters, R part files."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from sluice.contracts import PrepareProblem
from sluice.manifest import MAX_REASONS, Problems
from sluice.prepare import partitions_of
from sluice.shards import ShardWriter

if TYPE_CHECKING:
    from sluice.incremental.mapside import VersionSink

WHERE = "\0"  # stands for "<name> line <n>" in a reason; collect() writes the global line there
FLUSH_BUDGET = 262_144  # keys buffered over all partitions before they are written as blocks
PART_BLOCK_KEYS = 4096


class TaskProblems(Problems):
    """sluice.manifest.Problems that never stops the scan: keeps MAX_REASONS, counts all, tags task and line."""

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
    """R spill files in the shard format; keys buffered per partition and bucket, written in blocks."""

    def __init__(self, directory: str, partitions: int) -> None:
        self.paths = [os.path.join(directory, f"{r}.part") for r in range(partitions)]
        self._files: list[BinaryIO] = [open(p, "wb") for p in self.paths]  # noqa: SIM115 - closed in close()
        self._writers = [ShardWriter(f, sort=False, level=1, block_keys=PART_BLOCK_KEYS) for f in self._files]
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
        for bucket, keys in self._buf[r].items():
            writer.add(bucket, keys)
            self.counts[r] += len(keys)
        self._buf[r] = {}
        self._held[r] = 0

    def close(self) -> None:
        for r, writer in enumerate(self._writers):
            self._flush(r)
            writer.close()
            self._files[r].close()

    def abort(self) -> None:
        for f in self._files:
            f.close()


Version = tuple[str, str | None]  # (ETag, version id) of an object as the input names it


@dataclass
class Sink:
    """Where valid keys go: the suffix and allowed-bucket filters (as sluice.manifest.iter_keys), then Parts.

    An incremental run's sink also hands each key's current object version to `versions`: the
    listing's or inventory's when the batch carries them, else a HEAD (sluice.incremental).
    """

    parts: Parts
    problems: TaskProblems
    allowed: frozenset[str]
    suffixes: tuple[str, ...] | None
    keys_in: int = 0
    versions: VersionSink | None = None

    def not_allowed(self, bucket: str, key: str, where: str = "") -> bool:
        """True (and a problem noted) when allowed buckets are set and `bucket` is not one."""
        if not self.allowed or bucket in self.allowed:
            return False
        self.problems.add(
            f"{where}s3://{bucket}/{key[:80]}: bucket {bucket!r} is not allowed "
            f"(SLUICE_ALLOWED_BUCKETS: {', '.join(sorted(self.allowed))})"
        )
        return True

    def batch(self, bucket: str, keys: list[str], versions: list[Version | None] | None = None) -> None:
        """Keys of one bucket (an inventory or listing batch, with their versions when it has them).

        One problem per batch when the bucket is not allowed.
        """
        if not keys or self.not_allowed(bucket, keys[0]):
            return
        if self.suffixes:
            keep = [i for i, k in enumerate(keys) if k.lower().endswith(self.suffixes)]
            keys = [keys[i] for i in keep]
            versions = None if versions is None else [versions[i] for i in keep]
        self.keys_in += len(keys)
        pairs = [(bucket, k) for k in keys]
        self.parts.add(pairs)
        if self.versions is not None:
            self.versions.current(pairs, versions)

    def pairs(self, pairs: list[tuple[str, str]]) -> None:
        """Key-list pairs, already checked against the allowed buckets."""
        if self.suffixes:
            pairs = [p for p in pairs if p[1].lower().endswith(self.suffixes)]
        self.keys_in += len(pairs)
        self.parts.add(pairs)
        if self.versions is not None:
            self.versions.current(pairs, None)
