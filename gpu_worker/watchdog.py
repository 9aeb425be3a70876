"""A rank's progress beat and its stall watchdog (guard 1 of docs/architecture.md "Stalls").

One daemon thread per rank reads the rank's processed count (images embedded + keys failed)
every `interval_s`. When the count moved, it writes a beat to the beats table (at most once an
interval, only on a change: a rank that makes no progress writes nothing, so a stopped or
frozen container's beat simply ages and the control plane's sweep sees it). When the count
has not moved for `stall_after_s`, it ends the process with STALLED_EXIT through os._exit,
which needs neither the stuck thread nor its locks: Batch's retry strategy retries that exit
code (sluice.control.policy) and the next attempt resumes from the committed chunks.

The thread needs the interpreter: a native call that hangs while holding the GIL starves it
too, as does a stopped or frozen container. The sweep's guard (sluice.control.sweep.stall) covers
those, from the beats this thread wrote.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_worker.env import ContainerEnv
from gpu_worker.errors import STALLED
from gpu_worker.log import logger
from gpu_worker.telemetry.stats import Stats

LEGACY_STALL_AFTER_S = 1800.0  # a plan written before plans carried stall_after_s
LEGACY_LOAD_GRACE_S = 120.0  # a plan written before plans carried load_grace_s
BEAT_TTL_S = 15 * 86400  # beats expire with the sweep's lookback (sluice.control.sweep.reconcile.LOOKBACK_S)


def beat_key(shard: int, attempt: int, rank: int) -> str:
    """The beats table's sort key of one rank's attempt (sluice.control.sweep.stall reads it back)."""
    return f"{shard:06d}#{attempt:03d}#{rank:03d}"


@dataclass(frozen=True)
class BeatTarget:
    """Where a rank's beats go and what they name."""

    table: str  # the beats table (SLUICE_BEATS_TABLE); empty: no beats (the watchdog still runs)
    run_id: str
    job_id: str  # AWS_BATCH_JOB_ID: the child, node or plain job the sweep would terminate
    shard: int
    attempt: int
    rank: int


class Beats:
    """Writes one rank's beats (PutItem, the only action the worker role has on the table)."""

    def __init__(
        self,
        target: BeatTarget,
        stall_after_s: float,
        client: Any = None,
        todo: int = 0,
        parts: Callable[[], float] = lambda: 0.0,
        media_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self._t = target
        self._stall = stall_after_s
        self._client = client
        self.todo = todo  # the keys this attempt of the rank had to do: the sweep's rate and finish (tail)
        self._parts = parts  # rows embedded so far (a text's chunks, a video's frames): the local progress line
        self._media_s = media_s  # seconds of audio embedded so far: the same line
        self.started_at = time.time()
        self.ready_at: float | None = None  # when its models were ready: keys/s count from there

    def write(self, processed: int, moved_at: float, limit_s: float | None = None) -> None:
        """Record that the rank had processed `processed` keys at `moved_at` (epoch seconds).

        `limit_s`: how long it may stay still from there (stall_after_s, plus the load grace while loading).
        """
        limit = self._stall if limit_s is None else limit_s
        if self._t.table:
            self._put(processed, moved_at, limit)
        # Logged once stored: a reader of the log (the e2e test) may act on the beat the sweep sees.
        logger.debug("progress beat", extra={"processed": processed, "limit_s": limit})

    def _put(self, processed: int, moved_at: float, limit: float) -> None:
        """The beat item, put into the beats table."""
        if self._client is None:
            from sluice.aws.clients import client

            self._client = client("dynamodb", name="worker-beats")
        t = self._t
        item = {
            "pk": {"S": t.run_id},
            "sk": {"S": beat_key(t.shard, t.attempt, t.rank)},
            "job_id": {"S": t.job_id},
            "shard": {"N": str(t.shard)},
            "attempt": {"N": str(t.attempt)},
            "rank": {"N": str(t.rank)},
            "processed": {"N": str(processed)},
            "moved_at": {"N": f"{moved_at:.3f}"},
            "stall_after_s": {"N": f"{limit:g}"},
            "expires_at": {"N": str(int(moved_at) + BEAT_TTL_S)},
            "todo": {"N": str(self.todo)},
            "started_at": {"N": f"{self.started_at:.3f}"},
            "parts": {"N": str(int(self._parts()))},
        }
        if media_s := self._media_s():
            item["media_s"] = {"N": f"{media_s:.3f}"}
        if self.ready_at is not None:
            item["ready_at"] = {"N": f"{self.ready_at:.3f}"}
        try:
            self._client.put_item(TableName=t.table, Item=item)
        except Exception as exc:  # a lost beat only makes the sweep's view older; never fail the rank for it
            logger.warning("progress beat not written", extra={"error": f"{type(exc).__name__}: {exc}"[:300]})


@dataclass(frozen=True)
class Loading:
    """Whether the rank's models are still loading, and how much longer it may then stay still (the plan's)."""

    now: Callable[[], bool] = lambda: False
    grace_s: float = LEGACY_LOAD_GRACE_S


class Watchdog:
    """Beats on progress; ends the process with STALLED_EXIT when progress stops for stall_after_s."""

    def __init__(
        self,
        progress: Callable[[], float],
        stall_after_s: float,
        beats: Beats,
        *,
        interval_s: float = 10.0,
        exit_fn: Callable[[int], Any] = os._exit,
        loading: Loading | None = None,
    ) -> None:
        self._progress = progress
        loads = loading or Loading()
        self._loading, self.load_grace_s = loads.now, loads.grace_s
        self.stall_after_s = stall_after_s
        self._beats = beats
        self._interval = max(0.05, min(interval_s, stall_after_s / 4))
        self._exit = exit_fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sluice-watchdog", daemon=True)
        self.fired = False
        self._wrote = -1  # the count of the last beat written

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; a last beat records the final count (the tail's sweep reads finished ranks' times)."""
        self._stop.set()
        self._thread.join(timeout=5)
        if not self.fired and self._wrote != int(self._progress()):
            self._beats.write(int(self._progress()), time.time(), self.limit_s(False))

    def shrink(self, keys: int) -> None:
        """`keys` left the rank's work (split off to another shard): its beats' todo says so from the next one."""
        self._beats.todo = max(0, self._beats.todo - keys)

    def limit_s(self, loading: bool) -> float:
        """How long the rank may stay still: stall_after_s, plus the plan's load grace while its models load."""
        return self.stall_after_s + (self.load_grace_s if loading else 0.0)

    def _loop(self) -> None:
        last = (self._progress(), self._loading())
        moved_at = time.time()
        self._beats.write(int(last[0]), moved_at, self.limit_s(last[1]))  # the attempt is alive from here
        self._wrote = int(last[0])
        while not self._stop.wait(self._interval):
            now, seen = time.time(), (self._progress(), self._loading())
            if seen != last:  # a key done, or the models ready
                if last[1] and not seen[1]:
                    self._beats.ready_at = now
                last, moved_at = seen, now
                self._beats.write(int(seen[0]), now, self.limit_s(seen[1]))
                self._wrote = int(seen[0])
            elif now - moved_at >= self.limit_s(seen[1]):
                self.fired = True
                # os.write, not the logger: the stuck thread may hold the logging lock.
                msg = f"sluice-worker: stalled: no progress for {now - moved_at:.0f} s at {int(seen[0])} keys\n"
                os.write(2, msg.encode())
                self._exit(STALLED)
                return


def stall_after_s(plan_value: float | None, env: Mapping[str, str] | None = None) -> float:
    """SLUICE_STALL_AFTER_S when set, else the plan's (derived, or the manifest's job.stall_after_s)."""
    box = ContainerEnv.from_env(env)
    if box.stall_after_s is not None:
        return box.stall_after_s
    return float(plan_value) if plan_value else LEGACY_STALL_AFTER_S


def for_rank(
    ids: BeatTarget,
    plan_value: float | None,
    load_grace_s: float | None,
    stats: Stats,
    interval_s: float,
    todo: int = 0,
) -> Watchdog:
    """A started watchdog for one rank: its progress is keys embedded or failed, its models ready or not."""
    limit = stall_after_s(plan_value)
    grace = float(load_grace_s) if load_grace_s else LEGACY_LOAD_GRACE_S
    progress = lambda: stats.get("images") + stats.get("failed")  # noqa: E731
    loading = Loading(lambda: not stats.get("model_ready_seconds"), grace)
    beats = Beats(ids, limit, todo=todo, parts=lambda: stats.get("parts"), media_s=lambda: stats.get("media_s"))
    return Watchdog(progress, limit, beats, interval_s=interval_s, loading=loading).start()


def target(run_id: str, shard: int, attempt: int, rank: int, env: Mapping[str, str] | None = None) -> BeatTarget:
    """The beat target of a rank of this container (table and job id from its environment)."""
    environ = os.environ if env is None else env
    box = ContainerEnv.from_env(env)
    return BeatTarget(box.beats_table, run_id, environ.get("AWS_BATCH_JOB_ID", ""), shard, attempt, rank)
