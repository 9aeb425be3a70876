"""A rank's pass for a kind of many parts (text, video): fetch and split in threads, embed in batches, sink rows.

Fetch threads GET each object and split it into parts with every model's embedder (decode,
chunk or sample: CPU work off the rank's thread); the rank thread gathers split objects
until they hold a batch of parts, embeds them model by model, and gives each model's sink a
key's rows together, so a key settles once, whole. Failures go to the sinks as the image
path's do; a transient one is deferred to a final pass after the stream, as the loaders do.
"""

from __future__ import annotations

import random
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpu_worker.config import WorkerConfig
from gpu_worker.errors import ObjectFailure
from gpu_worker.fetch import Fetcher, object_meta
from gpu_worker.kinds.base import Embedder, Part
from gpu_worker.loader import RETRY, FetcherLike, Item, ObjMeta
from gpu_worker.log import logger
from gpu_worker.metrics import MetricsObserver
from gpu_worker.stats import Stats
from sluice.contracts import FailureReason


@dataclass(frozen=True)
class Split:
    """One object's parts, per model."""

    item: Item
    obj: ObjMeta
    parts: list[list[Part]]


@dataclass(frozen=True)
class Failed:
    """One object that gave no parts."""

    item: Item
    reason: str
    detail: str
    deferred: bool
    obj: tuple[str, str | None] | None = None


@dataclass
class PartsPass:
    """One rank's pass: its settings, models, sinks (one per model), counters and the keys' failure reasons."""

    cfg: WorkerConfig
    embedders: list[Embedder]
    sinks: list[Any]
    stats: Stats
    reasons: Counter[str] = field(default_factory=Counter)
    batch: int = 64


def _split(run: PartsPass, fetcher: FetcherLike, item: Item, final: bool) -> Split | Failed:
    """Fetch one object and split it with every model; a failure of either is the key's."""
    pos, bucket, key, phase = item
    item = (pos, bucket, key, RETRY if final else phase)
    try:
        data, etag, version = object_meta(fetcher.get(bucket, key, final=final))
    except ObjectFailure as f:
        return Failed(item, str(f.reason), f.detail, f.transient and not final)
    started = time.perf_counter()
    try:
        parts = [e.split(data) for e in run.embedders]
    except ObjectFailure as f:
        return Failed(item, str(f.reason), f.detail, False, (etag, version))
    except Exception as exc:  # a decoder bug must not take the rank down: the key fails
        detail = f"{type(exc).__name__}: {exc}"[:300]
        return Failed(item, str(FailureReason.CORRUPT), detail, False, (etag, version))
    finally:
        run.stats.incr("decode_seconds", time.perf_counter() - started)
    notes = [p[0].note for p in parts if p and p[0].note]
    if notes:  # a partly damaged video: its good frames are kept, and the log and counters say so
        run.stats.incr("damaged_objects")
        logger.warning("object partly damaged: its decodable parts kept", extra={"key": key, "note": notes[0]})
    return Split(item, (etag, version, len(data)), parts)


def _fail(run: PartsPass, f: Failed) -> None:
    """A key's failure to every sink that still owes it (as gpu_worker.rank does for the image path)."""
    pos, bucket, key, phase = f.item
    owners = [sink for sink in run.sinks if sink.owns(pos, phase)]
    for sink in owners:
        if f.obj is not None:
            sink.read_as(pos, f.obj)
        sink.add_failure(pos, f"s3://{bucket}/{key}", phase, f.reason, f.detail, f.deferred)
    if owners and not f.deferred:
        run.reasons[f.reason] += 1


def _embed(run: PartsPass, ready: Sequence[Split]) -> None:
    """Embed every part of `ready` with each model; each model's sink gets each key's rows at once."""
    for m, (embedder, sink) in enumerate(zip(run.embedders, run.sinks)):
        mine = [s for s in ready if sink.owns(s.item[0], s.item[3])]
        if not mine:
            continue
        t0 = time.perf_counter()
        emb = embedder.embed([p.payload for s in mine for p in s.parts[m]])
        run.stats.incr("model_seconds", time.perf_counter() - t0)
        row = 0
        for s in mine:
            n = len(s.parts[m])
            pos, bucket, key, phase = s.item
            uri = f"s3://{bucket}/{key}"
            parts = [(p.part, p.start, p.end) for p in s.parts[m]]
            sink.add_rows([pos] * n, [uri] * n, [phase] * n, emb[row : row + n], [s.obj] * n, parts)
            row += n
    run.stats.incr("images", len(ready))
    run.stats.incr("parts", sum(len(s.parts[0]) for s in ready))
    run.stats.incr("batches")


class _Batcher:
    """Split objects gathered until they hold a batch of parts (the first model's)."""

    def __init__(self, run: PartsPass) -> None:
        self.run = run
        self.ready: list[Split] = []
        self.parts = 0

    def add(self, got: Split | Failed) -> None:
        if isinstance(got, Failed):
            _fail(self.run, got)
            return
        self.ready.append(got)
        self.parts += len(got.parts[0])
        if self.parts >= self.run.batch:
            self.flush()

    def flush(self) -> None:
        if self.ready:
            _embed(self.run, self.ready)
        self.ready, self.parts = [], 0


def _pass(run: PartsPass, fetcher: FetcherLike, items: Iterable[Item], final: bool) -> list[Item]:
    """Split and embed `items` (in submission order); returns the keys deferred to the final pass."""
    batcher = _Batcher(run)
    deferred: list[Item] = []
    inflight: deque[Future[Split | Failed]] = deque()
    width = max(1, run.cfg.fetch_concurrency)
    with ThreadPoolExecutor(width, thread_name_prefix="parts") as pool:

        def settle(fut: Future[Split | Failed]) -> None:
            got = fut.result()
            if isinstance(got, Failed) and got.deferred:
                deferred.append(got.item)
            batcher.add(got)

        for item in items:
            inflight.append(pool.submit(_split, run, fetcher, item, final))
            while len(inflight) >= 2 * width:
                settle(inflight.popleft())
        while inflight:
            settle(inflight.popleft())
    batcher.flush()
    return deferred


def run_parts(run: PartsPass, items: Iterable[Item], fetcher: FetcherLike | None = None) -> None:
    """The rank's keys through its models into its sinks: main pass, then the deferred keys once more."""
    fetcher = fetcher or Fetcher(run.cfg, observer=MetricsObserver(run.stats))
    deferred = _pass(run, fetcher, items, final=False)
    if deferred:
        time.sleep(run.cfg.final_backoff_base_s * random.uniform(0.5, 1.0))
        _pass(run, fetcher, deferred, final=True)


def parts_pass(
    cfg: WorkerConfig, embedders: list[Embedder], open_sink: Callable[[int, Embedder], Any], stats: Stats, batch: int
) -> PartsPass:
    """A PartsPass with each model's sink opened."""
    return PartsPass(cfg, embedders, [open_sink(m, e) for m, e in enumerate(embedders)], stats, batch=batch)
