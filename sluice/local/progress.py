"""A local run's progress: a bar with rate and ETA on a terminal, a log line now and then otherwise."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts.sections import KIND_WORDS, TIMED_KINDS
from sluice.control.table.items import RunItem
from sluice.control.table.records import ShardRecords
from sluice.paths import is_commit_marker

BAR_WIDTH = 24
TTY_EVERY_S = 0.5  # a terminal redraws in place
LOG_EVERY_S = float(os.environ.get("SLUICE_LOCAL_PROGRESS_S", "10"))  # a log file gets one line this often


def duration(seconds: float) -> str:
    """1h02m, 3m05s or 42s."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


@dataclass(frozen=True)
class Snapshot:
    """What the run has done so far."""

    status: str
    shards_done: int
    shards_total: int
    images: int  # objects settled (images, documents or videos)
    images_total: int
    elapsed_s: float
    workers: int
    kind: str = "image"
    parts: int = 0  # rows written: a text's chunks, a video's frames (an image is one)
    media_s: float = 0.0  # seconds of audio embedded (an audio run)

    @property
    def rate(self) -> float:
        return self.images / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the rate so far; None before the first image."""
        if self.rate <= 0 or self.images_total <= 0:
            return None
        return max(0, self.images_total - self.images) / self.rate

    def line(self, bar: bool) -> str:
        frac = min(1.0, self.images / self.images_total) if self.images_total else 0.0
        eta = "--" if self.eta_s is None else duration(self.eta_s)
        head = f"[{'#' * int(frac * BAR_WIDTH):<{BAR_WIDTH}}] {frac:4.0%} " if bar else f"{frac:.0%} "
        noun, part = KIND_WORDS[self.kind]
        seconds = f", {self.media_s:,.1f} s of audio" if self.kind in TIMED_KINDS else ""
        parts = f" ({self.parts} {part}{seconds})" if part else ""
        rate = f"{self.rate:.1f} img/s" if noun == "images" else f"{self.rate:.1f} {noun}/s"
        return (
            f"{head}{self.status} {noun} {self.images}/{self.images_total}{parts} shards "
            f"{self.shards_done}/{self.shards_total} {rate} ETA {eta} workers {self.workers}"
        )


class Progress:
    """Reads progress from commit markers and the ledger; draws it on stderr."""

    def __init__(
        self, c: Any, table: str, enabled: bool, stream: TextIO | None = None, beats: str | None = None
    ) -> None:
        self._c, self._table, self._enabled = c, table, enabled
        self._beats = beats  # the beats table: what the ranks embedded before their chunks commit
        self._out = stream or sys.stderr
        self._tty = self._out.isatty()
        self._seen: dict[str, tuple[int, int, float]] = {}  # marker key -> (objects, rows, seconds of audio)
        self._kind = "image"  # the run's input kind, from its plan
        self._t0 = time.monotonic()
        self._last = float("-inf")
        self._prefixes: list[str] = []  # each model's output prefix, from the plan

    def settled(self, output_prefix: str) -> tuple[int, int, float]:
        """(objects settled, rows written, seconds of audio) of every committed chunk so far (each marker read once).

        A marker's `covers` are the shard positions it settles (succeeded or failed), so objects
        count once however many rows (a text's chunks, a video's frames) each became.
        """
        bucket, prefix = parse_s3_uri(output_prefix, allow_empty_key=True)
        objects = rows = 0
        seconds = 0.0
        for page in self._c.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                k = o["Key"]
                if is_commit_marker(k) and k not in self._seen:
                    m = json.loads(self._c.s3.get_object(Bucket=bucket, Key=k)["Body"].read())
                    # A handed marker's keys are settled by the split child's own chunks.
                    covered = 0 if m.get("kind") == "handed" else sum(int(b) - int(a) for a, b in m.get("covers", []))
                    parts = int(m.get("parts", m.get("rows", 0)))  # rows: objects embedded
                    self._seen[k] = (covered, parts, float(m.get("media_s", 0.0)))
                got = self._seen.get(k, (0, 0, 0.0))
                objects, rows, seconds = objects + got[0], rows + got[1], seconds + got[2]
        return objects, rows, seconds

    def _settled(self, row: RunItem) -> tuple[int, int, float]:
        """(objects, rows, seconds of audio) of the slowest model (each model settles every object)."""
        if not self._prefixes and row.plan_uri:
            from sluice.aws.store import ObjectStore
            from sluice.contracts.plan import RunPlan

            with contextlib.suppress(Exception):  # not written yet (a preparing run): the next draw reads it
                plan = RunPlan.model_validate_json(ObjectStore(self._c.s3).get(row.plan_uri))
                self._prefixes = [plan.model_output_prefix(m) for m in range(len(plan.models))]
                self._kind = plan.content.kind
        prefixes = self._prefixes or ([row.output_prefix] if row.output_prefix else [])
        objects, rows, seconds = min((self.settled(p) for p in prefixes), default=(0, 0, 0.0))
        beaten, parts, beaten_s = self.beaten(row.run_id)
        return max(objects, beaten), max(rows, parts), max(seconds, beaten_s)

    def beaten(self, run_id: str) -> tuple[int, int, float]:
        """(objects, parts, seconds of audio) the ranks embedded so far, from their beats: each rank's newest attempt.

        A chunk commits only when full or at the shard's end; a rank beats as it embeds (a text
        model's batches too, with the chunks they held), so a run's progress moves before its
        first commit. Parts are a text's chunks or a video's frames (an image run counts none).
        """
        if not self._beats:
            return 0, 0, 0.0
        # (shard, rank) -> (attempt, processed, parts, seconds)
        newest: dict[tuple[str, str], tuple[int, int, int, float]] = {}
        pages = self._c.dynamodb.get_paginator("query").paginate(
            TableName=self._beats, KeyConditionExpression="pk = :r", ExpressionAttributeValues={":r": {"S": run_id}}
        )
        for page in pages:
            for item in page.get("Items", []):
                if "processed" not in item:  # the table's other items: a slice's fence, a split's record
                    continue
                shard, rank = item["shard"]["N"], item["rank"]["N"]
                parts = int(float(item.get("parts", {}).get("N", "0")))
                seconds = float(item.get("media_s", {}).get("N", "0"))
                got = (int(item["attempt"]["N"]), int(float(item["processed"]["N"])), parts, seconds)
                newest[(shard, rank)] = max(newest.get((shard, rank), got), got)
        return (
            sum(n[1] for n in newest.values()),
            sum(n[2] for n in newest.values()),
            sum(n[3] for n in newest.values()),
        )

    def show(self, row: RunItem | None, running: int, force: bool = False) -> None:
        every = TTY_EVERY_S if self._tty else LOG_EVERY_S
        if row is None or not self._enabled or (not force and time.monotonic() - self._last < every):
            return
        self._last = time.monotonic()
        objects, parts, seconds = self._settled(row)
        snap = Snapshot(
            status=row.status.value,
            shards_done=ShardRecords(self._c.dynamodb, self._table).counts(row.run_id).shards_done,
            shards_total=row.total_shards,
            images=objects,
            images_total=int(row.total_keys or 0),
            elapsed_s=time.monotonic() - self._t0,
            workers=running,
            kind=self._kind,
            parts=parts,
            media_s=seconds,
        )
        if self._tty:
            self._out.write(f"\r  {snap.line(bar=True)}   ")
        else:
            self._out.write(f"sluice: progress: {snap.line(bar=False)}\n")
        self._out.flush()

    def end(self) -> None:
        if self._enabled and self._tty:
            self._out.write("\n")
