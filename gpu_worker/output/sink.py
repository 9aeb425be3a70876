"""A rank's ChunkSink: results by window, each window committed as Parquet then its marker, on a writer thread.

A rank's ChunkSink groups results by window (up to chunk_keys consecutive positions of its
slice). Results arrive in completion order; a window is committed as soon as every position
in it is settled or deferred: Parquet first (rows sorted by position), marker second, on a
writer thread so the model loop never waits on a PUT. Final-pass results form retry chunks.
"""

from __future__ import annotations

import queue
import threading
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpu_worker.errors import WorkerError
from gpu_worker.output import intervals
from gpu_worker.output.commits import HANDED, RETRY, Marker, Paths
from gpu_worker.output.intervals import Span
from gpu_worker.output.parquet import WHOLE, Part, RecordLabel, output_table, table_bytes
from gpu_worker.sources.fetch import ObjMeta
from gpu_worker.telemetry.stats import Observer, Stats
from sluice.aws.store import ObjectStore


@dataclass
class _Chunk:
    expected: int  # positions to settle (windows); -1 for retry chunks (size-bounded)
    spans: list[Span]
    rows: list[tuple[int, str, np.ndarray, ObjMeta, Part]] = field(default_factory=list)
    failed: list[dict[str, Any]] = field(default_factory=list)
    deferred: list[tuple[int, str]] = field(default_factory=list)
    committed: bool = False
    embedded: set[int] = field(default_factory=set)  # positions with rows: a text or video key has several

    @property
    def settled(self) -> int:
        return len(self.embedded) + len(self.failed) + len(self.deferred)


@dataclass(frozen=True)
class SinkSpec:
    """What one rank writes for one model: who writes, what it owes, and what its chunks hold."""

    rank: int  # the global rank: chunk names and markers carry it
    attempt: int  # this attempt (AWS_BATCH_JOB_ATTEMPT): markers and retry chunks carry it
    windows: list[list[Span]]  # the main pass's chunks, each up to chunk_keys positions of the rank's remaining work
    chunk_keys: int  # a retry chunk is committed at this many settled keys
    dtype: str  # float16 | float32: the embedding column's type
    metadata: dict[str, str]  # Parquet file metadata (each key gets a "sluice." prefix)
    label: RecordLabel
    retry: Sequence[int] = ()  # earlier attempts' deferred positions this sink is owed a final-pass result for
    timed: bool = False  # parts are spans of seconds (audio): markers carry the seconds their objects hold


class ChunkSink:
    """Collects one rank's results and commits chunks; thread-compatible (one caller thread)."""

    def __init__(self, store: ObjectStore, paths: Paths, spec: SinkSpec, observer: Observer | None = None) -> None:
        self._store, self._paths = store, paths
        self._label, self._timed = spec.label, spec.timed
        # Final-pass positions this sink is owed a result for: earlier attempts' deferred keys
        # (`retry`) and, as they come, this attempt's own deferrals.
        self._retry_owed = set(spec.retry)
        self._rank, self._attempt = spec.rank, spec.attempt
        self._chunk_keys, self._dtype, self._metadata = spec.chunk_keys, spec.dtype, spec.metadata
        self._obs = observer or Stats()
        windows = spec.windows
        self._windows = [_Chunk(intervals.count(w), w) for w in windows]
        flat = sorted((a, b, i) for i, w in enumerate(windows) for a, b in w)
        self._starts = [a for a, _, _ in flat]
        self._flat = flat
        self._retry = _Chunk(-1, [])
        self._jobs: queue.Queue[tuple[str, _Chunk, str, dict[str, Any]] | None] = queue.Queue(maxsize=8)
        self._error: BaseException | None = None
        self._writer = threading.Thread(target=self._write_loop, name="chunk-writer", daemon=True)
        self._writer.start()
        self.committed = 0
        self._read: dict[int, tuple[str, str | None]] = {}  # position -> (etag, version id) of bytes that failed

    def read_as(self, pos: int, obj: tuple[str, str | None]) -> None:
        """The object version read for `pos`, whose failure add_failure records next."""
        self._read[pos] = obj

    def _window(self, pos: int) -> _Chunk:
        i = bisect_right(self._starts, pos) - 1
        if i < 0 or not self._flat[i][0] <= pos < self._flat[i][1]:
            raise WorkerError(f"position {pos} is not in this rank's remaining work")
        return self._windows[self._flat[i][2]]

    def _check(self) -> None:
        if self._error is not None:
            raise WorkerError(f"writing output failed: {self._error}") from self._error

    def owns(self, pos: int, phase: int) -> bool:
        """Whether this sink still needs a result for `pos` (with several models, each resumes on its own)."""
        if phase == RETRY:
            return pos in self._retry_owed
        i = bisect_right(self._starts, pos) - 1
        return i >= 0 and self._flat[i][0] <= pos < self._flat[i][1]

    def add_rows(
        self,
        positions: Sequence[int],
        uris: Sequence[str],
        phases: Sequence[int],
        emb: np.ndarray,
        objs: Sequence[ObjMeta],
        parts: Sequence[Part] | None = None,
    ) -> None:
        """Embedded keys: row i of `emb` is positions[i]; `objs` their (etag, version id, size).

        A key of several parts (`parts`: (part, start, end) per row) comes in one call with all
        its rows, so it settles once, whole.
        """
        self._check()
        fresh: list[tuple[_Chunk, int, int]] = []
        for i, (pos, uri, phase) in enumerate(zip(positions, uris, phases)):
            chunk = self._retry if phase == RETRY else self._window(pos)
            chunk.rows.append((pos, uri, emb[i], objs[i], parts[i] if parts else WHOLE))
            if pos not in chunk.embedded:
                chunk.embedded.add(pos)
                fresh.append((chunk, pos, phase))
        for chunk, pos, phase in fresh:  # every row is in before any chunk commits
            if phase == RETRY:  # settled: a second final-pass result for it (another model's fetch) is not ours
                self._retry_owed.discard(pos)
            self._settled(chunk, phase)

    def add_failure(self, pos: int, uri: str, phase: int, reason: str, detail: str, deferred: bool) -> None:
        self._check()
        if deferred:
            if phase != RETRY:  # a retry-phase key deferred again is already owed a final result
                chunk = self._window(pos)
                chunk.deferred.append((pos, uri))
                self._retry_owed.add(pos)
                self._settled(chunk, phase)
            return
        chunk = self._retry if phase == RETRY else self._window(pos)
        if phase == RETRY:
            self._retry_owed.discard(pos)
        failure = {"pos": pos, "key": uri, "reason": reason, "detail": detail, "attempt": self._attempt}
        if (obj := self._read.pop(pos, None)) is not None:
            failure.update(etag=obj[0], version_id=obj[1])
        chunk.failed.append(failure)
        self._settled(chunk, phase)

    def _settled(self, chunk: _Chunk, phase: int) -> None:
        if phase == RETRY:
            if chunk.settled >= self._chunk_keys:
                self._commit_retry()
        elif chunk.settled == chunk.expected and not chunk.committed:
            self._commit(chunk, "range")

    def _commit_retry(self) -> None:
        chunk, self._retry = self._retry, _Chunk(-1, [])
        if chunk.settled:
            chunk.spans = intervals.from_points([r[0] for r in chunk.rows] + [f["pos"] for f in chunk.failed])
            self._commit(chunk, "retry")

    def _commit(self, chunk: _Chunk, kind: str) -> None:
        chunk.committed = True
        first = chunk.spans[0][0]
        name = self._paths.chunk_name(self._rank, first, self._attempt if kind == "retry" else None)
        while True:
            self._check()
            try:
                self._jobs.put((name, chunk, kind, {}), timeout=0.5)
                return
            except queue.Full:
                continue

    def _write_loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if self._error is not None:
                continue
            try:
                self._write(*job)
            except BaseException as exc:
                self._error = exc

    def _write(self, name: str, chunk: _Chunk, kind: str, extra: dict[str, Any]) -> None:
        rows = sorted(chunk.rows, key=lambda r: (r[0], r[4][0]))
        deferred = {p for p, _ in chunk.deferred}
        covers = intervals.subtract(chunk.spans, intervals.from_points(deferred)) if kind == "range" else chunk.spans
        file = None
        if rows:
            emb = np.stack([r[2] for r in rows])
            meta = {**self._metadata, "chunk": name}
            objs, parts = [r[3] for r in rows], [r[4] for r in rows]
            data = table_bytes(output_table([r[1] for r in rows], emb, self._dtype, objs, self._label, parts), meta)
            self._store.put(self._paths.parquet(name), data)
            file = name + ".parquet"
        marker = Marker(
            name=name,
            kind=kind,
            rows=len(chunk.embedded),
            covers=covers,
            deferred=sorted(chunk.deferred),
            failed=sorted(chunk.failed, key=lambda f: f["pos"]),
            attempt=self._attempt,
            rank=self._rank,
            file=file,
            # parts: Parquet rows (chunks, frames, windows); media_s: seconds of audio
            extra={"committed_at": time.time(), "parts": len(rows), **self._seconds(rows), **extra},
        )
        self._store.put(self._paths.marker(name), marker.to_json(), "application/json")
        self.committed += 1
        self._obs.incr("chunks_committed")

    def _seconds(self, rows: list[Any]) -> dict[str, float]:
        """{"media_s": seconds} of a timed sink's rows: each object's last part's end (a key's rows share a chunk)."""
        if not self._timed:
            return {}
        ends: dict[int, float] = {}
        for pos, *_, part in rows:  # part: (index, start, end)
            ends[pos] = max(ends.get(pos, 0.0), float(part[2]))
        return {"media_s": round(sum(ends.values()), 3)}

    def hand_off(self, span: Span, to_shard: int) -> None:
        """`span` was split off to shard `to_shard`: no window waits for it, and a handed marker records it.

        The rank started no key in `span` (its fence), so a window that reached into it is complete
        with what it settled below; it commits now if that is everything.
        """
        self._check()
        for w in self._windows:
            if w.committed:
                continue
            w.spans = intervals.subtract(w.spans, [span])
            w.expected = intervals.count(w.spans)
            if not w.spans:
                w.committed = True  # wholly the child's: nothing of it is written here
            elif w.settled == w.expected:
                self._commit(w, "range")
        handed = _Chunk(intervals.count([span]), [span])
        handed.committed = True
        name = self._paths.chunk_name(self._rank, span[0]).replace("part-", "handed-", 1)
        extra = {"to_shard": to_shard}
        while True:
            self._check()
            try:
                self._jobs.put((name, handed, HANDED, extra), timeout=0.5)  # after every chunk queued before it
                return
            except queue.Full:
                continue

    def close(self) -> None:
        """Commit the last retry chunk, wait for every write; raises if any window is incomplete."""
        self._check()
        self._commit_retry()
        self._jobs.put(None)
        self._writer.join()
        self._check()
        open_windows = [w for w in self._windows if not w.committed]
        if open_windows:
            w = open_windows[0]
            raise WorkerError(
                f"{len(open_windows)} chunks never completed (first: {w.spans[0]}, {w.settled}/{w.expected} settled)"
            )

    def abort(self) -> None:
        """Commit nothing more; a write already under way finishes (it is a complete chunk) first."""
        self._error = self._error or WorkerError("aborted")
        self._jobs.put(None)
        self._writer.join(timeout=60)
