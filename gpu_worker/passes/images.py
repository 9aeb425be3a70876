"""The image pass: loaders fill shared batch buffers, each model's engine embeds every batch, rows go to its sink.

The loaders and the feeder start first, before the models load (torch is imported by `load`,
not at module level): the first GETs and decodes run while the models load, trace and
dry-run, so the models have full batches waiting when they are ready (as far as
buffer_count allows). With several models, images are decoded once at the largest input
size; each engine resizes on its device.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from gpu_worker.decode.preprocess import shared
from gpu_worker.errors import ConfigError, RankFailed, WorkerError
from gpu_worker.log import logger
from gpu_worker.models.spec import input_preprocess
from gpu_worker.output.sink import ChunkSink
from gpu_worker.passes.base import RankPass, open_sinks, torch_setup
from gpu_worker.passes.loader_loop import BatchMsg, DoneMsg, ErrorMsg, FailMsg
from gpu_worker.passes.loader_pool import LoaderShape, RankLoaders, feed, plan_loaders
from gpu_worker.passes.work import RankContext, RankWork
from gpu_worker.telemetry.observe import MetricsObserver


def embed_rows(sink: ChunkSink, msg: BatchMsg, emb: Any) -> None:
    """A batch's embeddings from one model to its sink: the rows that model still owes (all, unless resumed)."""
    keep = [i for i in range(msg.n) if sink.owns(msg.positions[i], msg.phases[i])]
    if len(keep) == msg.n:
        sink.add_rows(msg.positions, msg.uris, msg.phases, emb[: msg.n], msg.objs)
    elif keep:
        pick = lambda xs: [xs[i] for i in keep]  # noqa: E731
        sink.add_rows(pick(msg.positions), pick(msg.uris), pick(msg.phases), emb[keep], pick(msg.objs))


class ImagePass(RankPass):
    """One rank of an image run: its loaders, its models (one Engine each) and their sinks."""

    def __init__(self, ctx: RankContext, work: RankWork) -> None:
        super().__init__(ctx, work)
        self.engines: list[Any] = []
        self.loaders: RankLoaders | None = None
        self._feeder: threading.Thread | None = None
        self._feed_errors: list[BaseException] = []

    def load(self) -> None:
        """Start the loaders and the feeder, then load the models and open their sinks."""
        ctx = self.ctx
        threads = plan_loaders(ctx.cfg, ctx.spec.device, ctx.spec.world)
        preps = [input_preprocess(path, m.image_size) for path, m in zip(ctx.spec.model_paths, ctx.plan.models)]
        try:
            prep = shared(preps)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        sizes = [p.size for p in preps]
        self.loaders = loaders = RankLoaders(ctx, LoaderShape(threads, ctx.batch, prep))
        args = (loaders, self.work.keys(), self._feed_errors)
        self._feeder = threading.Thread(target=feed, args=args, name="feeder", daemon=True)
        self._feeder.start()
        try:
            t0 = time.perf_counter()
            self._load_engines(sizes, threads.torch_threads)
            ctx.stats.incr("model_load_seconds", time.perf_counter() - t0)
            ctx.stats.incr("prefetched_batches", loaders.out_q.qsize())
            self.outputs = open_sinks(ctx, self.work, self.engines)
        except BaseException:
            loaders.close()
            raise
        self.names = [e.info.name for e in self.engines]
        self.pipeline_started = time.perf_counter()
        self._log_ready(threads)

    def _load_engines(self, sizes: list[int], torch_threads: int) -> None:
        """Each model on the rank's device, traced and dry-run on batches of the pass's decoded size."""
        from gpu_worker.models.engine import Engine, EngineOptions
        from gpu_worker.models.load import load_model

        ctx = self.ctx
        device = torch_setup(ctx, torch_threads)
        options = EngineOptions(autocast=ctx.cfg.autocast, jit=ctx.cfg.jit, input_size=max(sizes))
        for path, planned, want in zip(ctx.spec.model_paths, ctx.plan.models, sizes):
            model, info = load_model(path, planned.image_size)
            if info.image_size != want:  # models.spec and load_model read the same spec: a mismatch is a bug
                raise ConfigError(f"model {info.name}: input size {info.image_size}, but its spec file said {want}")
            observer = MetricsObserver(ctx.stats)
            self.engines.append(Engine(model, info, device, ctx.batch, options, observer=observer))

    def _log_ready(self, threads: Any) -> None:
        engines = self.engines
        logger.info(
            "model ready",
            extra={
                "model": engines[0].info.name,
                "models": self.names,
                "dim": engines[0].output_dim,
                "device": self.ctx.spec.torch_device,
                "batch_size": self.ctx.batch,
                "image_size": engines[0].input_size,
                "loaders": threads.loaders,
                "decode_threads": threads.decode_threads,
                "torch_threads": threads.torch_threads,
                "prefetched_batches": int(self.ctx.stats.snapshot().get("prefetched_batches", 0)),
            },
        )

    def stream(self) -> None:
        """Every batch through the models into their sinks, until every loader is done; then the last results."""
        done: set[int] = set()
        started, first = time.perf_counter(), True
        while len(done) < self._loaders.n:
            msg = self._next_message(done)
            if isinstance(msg, BatchMsg):
                if first:
                    self.ctx.stats.incr("first_batch_seconds", time.perf_counter() - started)
                    first = False
                self._batch(msg)
            elif isinstance(msg, FailMsg):
                self.outputs.fail(msg.failure)
            elif isinstance(msg, DoneMsg):
                done.add(msg.loader)
                self.ctx.stats.add(msg.stats)
            elif isinstance(msg, ErrorMsg):
                raise RankFailed(msg.message)
            elif msg is not None:  # pragma: no cover
                raise WorkerError(f"unknown loader message {type(msg).__name__}")
        for sink, engine in zip(self.outputs.sinks, self.engines):
            for tag, emb in engine.drain():
                embed_rows(sink, tag, emb)

    @property
    def _loaders(self) -> RankLoaders:
        assert self.loaders is not None, "load() first"
        return self.loaders

    def _batch(self, msg: BatchMsg) -> None:
        """One full buffer through every model (each queues or returns finished batches); the buffer handed back."""
        import torch

        loaders, stats = self._loaders, self.ctx.stats
        stats.add(msg.stats)
        host = torch.from_numpy(loaders.buffers[msg.loader].array(msg.buffer))
        finished = [engine.submit(host, msg) for engine in self.engines]
        del host
        loaders.free_qs[msg.loader].put(msg.buffer)
        stats.incr("batches")
        stats.incr("images", msg.n)
        stats.incr("padded_slots", self.ctx.batch - msg.n)
        for sink, results in zip(self.outputs.sinks, finished):
            for tag, emb in results:
                embed_rows(sink, tag, emb)

    def _next_message(self, done: set[int]) -> Any:
        """The next loader message, or None after a quiet poll (which checks the feeder and the loaders)."""
        loaders, t0 = self._loaders, time.perf_counter()
        try:
            return loaders.out_q.get(timeout=0.5)
        except queue.Empty:
            if self._feed_errors:
                raise WorkerError(f"reading the shard failed: {self._feed_errors[0]}") from self._feed_errors[0]
            dead = loaders.dead(done)
            if dead:
                raise RankFailed(
                    f"loader process {dead[0]} died (exit code {loaders.procs[dead[0]].exitcode})"
                ) from None
            return None
        finally:
            self.ctx.stats.incr("wait_seconds", time.perf_counter() - t0)

    def close(self, ok: bool) -> None:
        """Stop the loaders (after a success they have all reported done) and free their buffers; end the feeder.

        Then let go of the models, so their tensors are freed on this, the rank's thread: torch
        releases the GIL in a tensor's dealloc, which aborts a thread other than the one that
        finalizes the interpreter if that thread frees it during finalization.
        """
        if self.loaders is not None:
            self.loaders.close(finished=ok)
        if self._feeder is not None:
            self._feeder.join(timeout=5)  # closed loaders refuse its tasks: it returns within put_task's 0.5 s
        self.engines = []

    def queue_depth(self) -> int:
        return self.loaders.out_q.qsize() if self.loaders is not None else 0
