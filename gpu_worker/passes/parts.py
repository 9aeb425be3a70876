"""The parts pass (text, video): objects split into parts in fetch threads, parts embedded in batches.

Fetch threads GET each object and split it into parts with every model's embedder (decode,
chunk or sample: CPU work off the rank's thread); the rank thread gathers split objects
until they hold a batch of parts (a text model: several batches, which it sorts by length so
each batch pads little), embeds them model by model, and gives each model's sink a
key's rows together, so a key settles once, whole. Failures go to the sinks through
KeySinks.fail; a transient one is deferred to a final pass after the stream, as the image
pass's loaders do.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

from gpu_worker.config import WorkerConfig
from gpu_worker.kinds.base import Embedder, Loading, Part
from gpu_worker.kinds.load import load_embedder
from gpu_worker.log import logger
from gpu_worker.passes.base import KeySinks, RankPass, open_sinks, torch_setup
from gpu_worker.passes.keys import Got, Item, KeyFailure, final_backoff, take
from gpu_worker.passes.loader_pool import plan_loaders
from gpu_worker.passes.work import RankContext, RankWork
from gpu_worker.sources.fetch import Fetcher
from gpu_worker.telemetry.observe import MetricsObserver
from gpu_worker.telemetry.stats import Stats
from sluice.contracts.sections import TIMED_KINDS

Split = Got[list[list[Part]]]  # one object's parts, per model


@dataclass
class PartsStream:
    """Keys through a kind's models into their sinks: the settings, the models, the sinks, the batch in parts."""

    cfg: WorkerConfig
    embedders: list[Embedder]
    outputs: KeySinks
    batch: int
    timed: bool = False  # parts are spans of seconds (audio): "media_s" counts the seconds embedded

    @property
    def stats(self) -> Stats:
        return self.outputs.stats

    def run(self, items: Iterable[Item]) -> None:
        """Main pass over `items`, then the deferred keys once more after a backoff."""
        fetcher = Fetcher(self.cfg, observer=MetricsObserver(self.stats))
        deferred = self._pass(fetcher, items, final=False)
        if deferred:
            final_backoff(self.cfg.final_backoff_base_s)
            self._pass(fetcher, deferred, final=True)

    def _split(self, key: str, data: bytes) -> list[list[Part]]:
        """One object's parts with every model; a partly damaged one is kept, and the log and counters say so."""
        parts = [e.split(data) for e in self.embedders]
        notes = [p[0].note for p in parts if p and p[0].note]
        if notes:
            self.stats.incr("damaged_objects")
            logger.warning("object partly damaged: its decodable parts kept", extra={"key": key, "note": notes[0]})
        return parts

    def _pass(self, fetcher: Fetcher, items: Iterable[Item], final: bool) -> list[Item]:
        """Split and embed `items` (in submission order); returns the keys deferred to the final pass."""
        ready: list[Split] = []
        deferred: list[Item] = []
        inflight: deque[Future[Split | KeyFailure]] = deque()
        width = max(1, self.cfg.fetch_concurrency)
        group = max(e.sort_batches for e in self.embedders)  # batches gathered per embed call

        def settle(fut: Future[Split | KeyFailure]) -> None:
            got = fut.result()
            if isinstance(got, KeyFailure):
                if got.deferred:
                    deferred.append(got.item)
                self.outputs.fail(got)
                return
            ready.append(got)
            if sum(len(s.value[0]) for s in ready) >= self.batch * group:
                self._embed(ready)
                ready.clear()

        with ThreadPoolExecutor(width, thread_name_prefix="parts") as pool:
            for item in items:
                inflight.append(pool.submit(take, fetcher, item, final, partial(self._split, item.key), self.stats))
                while len(inflight) >= 2 * width:
                    settle(inflight.popleft())
            while inflight:
                settle(inflight.popleft())
        if ready:
            self._embed(ready)
        return deferred

    def _embed(self, ready: Sequence[Split]) -> None:
        """Embed every part of `ready` with each model; each model's sink gets each key's rows at once.

        The objects and parts count as they are embedded: an embedder that reports its batches
        (a text model's call holds several) credits each object the share of its parts a batch
        embedded, over every model; what is left is credited when the call ends, so the totals
        are the objects and parts of `ready`, as before, and the rank's progress (its beats, its
        metrics) moves batch by batch.
        """
        credit = Credit(self.stats, len(self.embedders))
        for m, (embedder, sink) in enumerate(zip(self.embedders, self.outputs.sinks)):
            mine = [s for s in ready if sink.owns(s.item.pos, s.item.phase)]
            if not mine:
                continue
            t0 = time.perf_counter()
            payloads = [p.payload for s in mine for p in s.value[m]]
            reporting = getattr(embedder, "embed_reporting", None)
            if reporting is not None:
                emb = reporting(payloads, credit.for_parts([len(s.value[m]) for s in mine]))
            else:
                emb = embedder.embed(payloads)
            self.stats.incr("model_seconds", time.perf_counter() - t0)
            row = 0
            for s in mine:
                n = len(s.value[m])
                item = s.item
                parts = [(p.part, p.start, p.end) for p in s.value[m]]
                sink.add_rows([item.pos] * n, [item.uri] * n, [item.phase] * n, emb[row : row + n], [s.obj] * n, parts)
                row += n
        credit.rest(len(ready), sum(len(s.value[0]) for s in ready))
        if self.timed:  # each object's seconds: its last part's end (the first model's parts, as the summary)
            self.stats.incr("media_s", sum(max((p.end for p in s.value[0]), default=0.0) for s in ready))
        self.stats.incr("batches")


class Credit:
    """The objects and parts one embed call has counted so far (Stats "images", "parts"), model by model."""

    def __init__(self, stats: Stats, models: int) -> None:
        self.stats, self.models = stats, max(1, models)
        self.objects = self.parts = 0.0

    def for_parts(self, per_object: list[int]) -> Callable[[list[int]], None]:
        """A batch reporter for one model's call: payload indices -> each owning object's share credited."""
        share = [1.0 / (n * self.models) for n in per_object for _ in range(n)]

        def done(idx: list[int]) -> None:
            objects, parts = sum(share[i] for i in idx), len(idx) / self.models
            self.objects, self.parts = self.objects + objects, self.parts + parts
            self.stats.incr("images", objects)
            self.stats.incr("parts", parts)

        return done

    def rest(self, objects: int, parts: int) -> None:
        """The call is over: what its batches did not credit (no reporting embedder, an object of no parts)."""
        self.stats.incr("images", objects - self.objects)
        self.stats.incr("parts", parts - self.parts)


class PartsPass(RankPass):
    """A rank of a text or video run: its kind's models on the rank's device, its keys through PartsStream."""

    def __init__(self, ctx: RankContext, work: RankWork) -> None:
        super().__init__(ctx, work)
        self._stream: PartsStream | None = None

    def load(self) -> None:
        """Each model of the run as its kind's embedder (gpu_worker.kinds.load_embedder), each with its sink."""
        ctx = self.ctx
        device = torch_setup(ctx, plan_loaders(ctx.cfg, ctx.spec.device, ctx.spec.world).torch_threads)
        t0 = time.perf_counter()
        loads = [
            Loading(p, m, ctx.plan.content, device, ctx.batch, ctx.cfg)
            for p, m in zip(ctx.spec.model_paths, ctx.plan.models)
        ]
        embedders = [load_embedder(how) for how in loads]
        ctx.stats.incr("model_load_seconds", time.perf_counter() - t0)
        self.names = [e.info.name for e in embedders]
        self.outputs = open_sinks(ctx, self.work, embedders)
        timed = ctx.plan.content.kind in TIMED_KINDS
        self._stream = PartsStream(ctx.cfg, embedders, self.outputs, ctx.batch, timed)

    def stream(self) -> None:
        assert self._stream is not None, "load() first"
        self._stream.run(self.work.keys())

    def close(self, ok: bool) -> None:
        """Let go of the models, so their tensors are freed on the rank's thread (ImagePass.close says why)."""
        self._stream = None
