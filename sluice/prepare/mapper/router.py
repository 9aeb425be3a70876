"""Where a map worker's keys go: problems kept with their task and line, the filters, R part files."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluice.prepare.mapper.parts import Parts, TaskProblems, Version

if TYPE_CHECKING:
    from sluice.prepare.mapper.versions import VersionRouter


MAX_BUCKETS = 100  # buckets a map worker reports (MapResult.buckets): enough for the Region check


@dataclass
class KeyRouter:
    """Where valid keys go: the suffix and allowed-bucket filters (as sluice.input.keys.iter_keys), then Parts.

    An incremental run's sink also hands each key's current object version to `versions`: the
    listing's or inventory's when the batch carries them, else a HEAD (sluice.prepare.mapper.versions).
    """

    parts: Parts
    problems: TaskProblems
    allowed: frozenset[str]
    suffixes: tuple[str, ...] | None
    keys_in: int = 0
    versions: VersionRouter | None = None
    buckets: set[str] = field(default_factory=set)  # the buckets its keys name (the submit's cross-Region check)

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
        if keys and len(self.buckets) < MAX_BUCKETS:
            self.buckets.add(bucket)
        pairs = [(bucket, k) for k in keys]
        self.parts.add(pairs)
        if self.versions is not None:
            self.versions.current(pairs, versions)

    def pairs(self, pairs: list[tuple[str, str]]) -> None:
        """Key-list pairs, already checked against the allowed buckets."""
        if self.suffixes:
            pairs = [p for p in pairs if p[1].lower().endswith(self.suffixes)]
        self.keys_in += len(pairs)
        if len(self.buckets) < MAX_BUCKETS:
            self.buckets.update(b for b, _ in pairs[:MAX_BUCKETS])  # a key list names few buckets
        self.parts.add(pairs)
        if self.versions is not None:
            self.versions.current(pairs, None)
