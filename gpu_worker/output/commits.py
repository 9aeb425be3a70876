"""Commit markers: what each Parquet chunk covers, and the shard state a retried attempt resumes from.

Layout under <output_prefix>shard=<i>/ :
    part-<rank>-<n>.parquet          the chunk (rank: 4 digits; n: first shard position, 9 digits,
                                     "-r<attempt>" for final-retry-pass chunks)
    _commits/part-<rank>-<n>.json    its marker, written AFTER the Parquet object

A chunk exists only once its marker does. A marker lists the positions it settles (`covers`:
embedded or permanently failed; for a `handed-<rank>-<n>` marker, split off to the shard it
names, `to_shard`), the keys it deferred to the final pass (`deferred`), and its
failures. Resume: a position in any marker's covers or deferred is not redone in the main
pass; deferred positions no marker covers are retried. No position is ever in two markers'
covers (checked at the end of the shard), so nothing is written twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gpu_worker.errors import WorkerError
from gpu_worker.output import intervals
from gpu_worker.output.intervals import Span
from sluice.aws.store import ObjectStore
from sluice.paths import COMMITS_DIR, failures_uri, is_commit_marker, join, result_uri, shard_output_dir

MARKER_VERSION = 1
# A key's phase: the main pass (its chunk covers a range) or the final retry pass (a retry chunk).
MAIN, RETRY = 0, 1
# A marker's kind for a span split off to another shard (no file, no rows; `to_shard` names it):
# its positions are claimed here, so no attempt redoes them, and settled there.
HANDED = "handed"


@dataclass(frozen=True)
class Paths:
    """Where one shard's files go."""

    output_dir: str  # <output_prefix>shard=<i>/
    failures: str  # <failures_prefix><i>.jsonl
    result: str  # <shards_prefix><i>.result.json

    @classmethod
    def for_shard(cls, output_prefix: str, failures_prefix: str, shards_prefix: str, shard: int) -> Paths:
        return cls(
            shard_output_dir(output_prefix, shard),
            failures_uri(failures_prefix, shard),
            result_uri(shards_prefix, shard),
        )

    @property
    def commits_dir(self) -> str:
        return join(self.output_dir, COMMITS_DIR)

    def chunk_name(self, rank: int, first: int, retry_attempt: int | None = None) -> str:
        return f"part-{rank:04d}-{first:09d}" + (f"-r{retry_attempt}" if retry_attempt is not None else "")

    def parquet(self, name: str) -> str:
        return self.output_dir + name + ".parquet"

    def marker(self, name: str) -> str:
        return self.commits_dir + name + ".json"


@dataclass
class Marker:
    name: str
    kind: str  # range | retry
    rows: int
    covers: list[Span]
    deferred: list[tuple[int, str]]
    failed: list[dict[str, Any]]
    attempt: int
    rank: int
    file: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "version": MARKER_VERSION,
                "name": self.name,
                "kind": self.kind,
                "file": self.file,
                "rows": self.rows,
                "covers": [list(r) for r in self.covers],
                "deferred": [list(d) for d in self.deferred],
                "failed": self.failed,
                "attempt": self.attempt,
                "rank": self.rank,
                **self.extra,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Marker:
        d = json.loads(data)
        if d.get("version") != MARKER_VERSION:
            raise WorkerError(f"commit marker {d.get('name')!r} has version {d.get('version')}")
        known = {"version", "name", "kind", "file", "rows", "covers", "deferred", "failed", "attempt", "rank"}
        return cls(
            name=d["name"],
            kind=d["kind"],
            rows=int(d["rows"]),
            covers=[(int(a), int(b)) for a, b in d["covers"]],
            deferred=[(int(p), str(u)) for p, u in d["deferred"]],
            failed=list(d["failed"]),
            attempt=int(d["attempt"]),
            rank=int(d["rank"]),
            file=d.get("file"),
            extra={k: v for k, v in d.items() if k not in known},
        )


@dataclass
class ShardState:
    """Everything committed so far for one shard."""

    markers: list[Marker]

    @property
    def covered(self) -> list[Span]:
        return intervals.normalize(r for m in self.markers for r in m.covers)

    @property
    def handed(self) -> list[Span]:
        """Positions split off to other shards (settled there, not here)."""
        return intervals.normalize(r for m in self.markers if m.kind == HANDED for r in m.covers)

    @property
    def claimed(self) -> list[Span]:
        """Positions the main pass must not redo: settled, or waiting for the final pass."""
        deferred = intervals.from_points(p for m in self.markers for p, _ in m.deferred)
        return intervals.normalize([*self.covered, *deferred])

    def pending_retry(self) -> list[tuple[int, str]]:
        """Deferred (position, uri) that no marker has settled yet."""
        covered = self.covered
        seen: dict[int, str] = {}
        for m in self.markers:
            for p, uri in m.deferred:
                if not intervals.contains(covered, p):
                    seen[p] = uri
        return sorted(seen.items())

    def overlaps(self) -> list[Span]:
        """Positions settled by more than one marker (must be empty)."""
        runs = sorted(r for m in self.markers for r in m.covers)
        bad: list[Span] = []
        end = -1
        for a, b in runs:
            if a < end:
                bad.append((a, min(b, end)))
            end = max(end, b)
        return intervals.normalize(bad)

    def to_json(self) -> bytes:
        return json.dumps([json.loads(m.to_json()) for m in self.markers]).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ShardState:
        return cls([Marker.from_json(json.dumps(d).encode()) for d in json.loads(data)])


def load_state(store: ObjectStore, paths: Paths, known: ShardState | None = None) -> ShardState:
    """Every committed marker of the shard; those in `known` (read before the ranks ran) are not read again."""
    have = {paths.marker(m.name): m for m in known.markers} if known else {}
    markers = [
        have.get(uri) or Marker.from_json(store.get(uri))
        for uri in store.list(paths.commits_dir)
        if is_commit_marker(uri)
    ]
    return ShardState(sorted(markers, key=lambda m: m.name))


def remove_orphans(store: ObjectStore, paths: Paths, state: ShardState) -> list[str]:
    """Delete Parquet objects no marker names (left by a killed attempt); returns their URIs."""
    keep = {paths.parquet(m.name) for m in state.markers if m.file}
    orphans = [
        u for u in store.list(paths.output_dir) if u.endswith(".parquet") and u not in keep and COMMITS_DIR not in u
    ]
    for uri in orphans:
        store.delete(uri)
    return orphans
