"""One rank: a contiguous slice of the shard, its loaders, and its models (one engine and sink each) on one device.

Run in-process by the node when it has one rank, else as `python -m gpu_worker.rank SPEC`.
Module-level imports stay torch-free: loader processes are spawned from here and re-import
this module, and they must not pay for (or hold memory of) torch.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from gpu_worker import intervals, watchdog
from gpu_worker.buffers import BufferSet, BufferSpec
from gpu_worker.commits import Paths, ShardState
from gpu_worker.config import WorkerConfig
from gpu_worker.env import ContainerEnv
from gpu_worker.errors import RankFailed, WorkerError, report
from gpu_worker.gpudecode import rank_decode_cfg
from gpu_worker.loader import BatchMsg, DoneMsg, ErrorMsg, FailMsg, FetcherLike, LoaderLink
from gpu_worker.log import logger, set_labels, setup
from gpu_worker.metrics import GpuProbe, MetricsObserver, RankCollector, RankMetrics, instance_type, keep_list
from gpu_worker.procs import cpu_count, die_with_parent, shm_prefix
from gpu_worker.remote_write import PushPolicy
from gpu_worker.stats import Stats
from gpu_worker.store import RunStore
from sluice.aws.s3uri import parse_s3_uri
from sluice.models import RunPlan
from sluice.shards import ShardReader, rank_slice

TASK_KEYS = 32  # keys per task message to the loaders


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank process needs (written as JSON by the node)."""

    plan_json: str
    shard: int
    node: int
    attempt: int
    local_rank: int
    world: int
    device: str  # cpu | cuda
    model_paths: list[str]  # local copy of each model of the plan, in its order
    state_paths: list[str]  # each model's committed markers (ShardState JSON): models resume on their own
    n_keys: int
    summary_path: str

    @property
    def global_rank(self) -> int:
        return self.node * self.world + self.local_rank


def plan_loaders(cfg: WorkerConfig, device: str, world: int) -> tuple[int, int, int]:
    """(loader processes or 0 for threads, decode threads per loader, torch threads) for one rank."""
    per_rank = max(1, cpu_count() // world)
    # GPU: decode needs more than one GIL, so loader processes. CPU: the model's threads already
    # hold every core, and a second process costs more than the GIL (docs/performance.md).
    auto = max(1, min(8, per_rank - 1)) if device == "cuda" else 0
    loaders = cfg.loaders if cfg.loaders >= 0 else auto
    decode = cfg.decode_threads or max(1, per_rank // max(1, loaders))
    torch_threads = cfg.torch_threads or (min(4, per_rank) if device == "cuda" else per_rank)
    return loaders, decode, torch_threads


def buffer_count(cfg: WorkerConfig, loaders: int, batch: int, size: int) -> int:
    """Batch buffers per loader: buffers_per_loader, or as many as prefetch_mib holds for the rank.

    At start-up the models load for seconds (tens for a large model on a GPU) while the loaders
    already fetch and decode: with room for more batches they do not stall, and the models
    start with a queue of ready batches. With process loaders the buffers are /dev/shm, shared
    by every rank of the node (the job definition's SharedMemorySize): size prefetch_mib for it.
    """
    batch_bytes = batch * size * size * 3
    fit = (cfg.prefetch_mib * 2**20) // (max(1, loaders) * batch_bytes)
    return max(cfg.buffers_per_loader, int(fit))


@dataclass(frozen=True)
class _Rank:
    """One rank's fixed inputs: its spec, the worker's settings, the run's plan, the store and its counters."""

    spec: RankSpec
    cfg: WorkerConfig
    plan: RunPlan
    store: RunStore
    stats: Stats


@dataclass(frozen=True)
class _PassShape:
    """How one rank runs its pass: its loaders and threads (plan_loaders), and the batches they fill."""

    loaders: int  # loader processes; 0: one loader thread inside the rank
    decode_threads: int  # concurrent decodes per loader
    torch_threads: int
    batch: int  # images per model step, the same for every model of the pass
    sizes: list[int]  # each model's input side, in the plan's order

    @property
    def size(self) -> int:
        """The side images are decoded at: the largest any model of the pass needs."""
        return max(self.sizes)


class _Loaders:
    """The rank's loaders (threads or processes) and their queues and buffers."""

    def __init__(self, rank: _Rank, shape: _PassShape, fetcher: FetcherLike | None = None) -> None:
        spec, n = rank.spec, shape.loaders
        cfg = rank.cfg.replace(decode_threads=shape.decode_threads)
        device = f"cuda:{spec.local_rank}" if spec.device == "cuda" else "cpu"
        cfg = rank_decode_cfg(cfg, rank.plan, device, rank.stats)  # JPEGs on the GPU: gpu_worker.gpudecode
        self.n = max(1, n)
        self.processes = n > 0
        self._stop = threading.Event()
        ctx = mp.get_context("spawn")
        prefix = shm_prefix(rank.plan.run_id, spec.shard)
        self.buffers: list[BufferSet] = []
        self.free_qs: list[Any] = []
        self.procs: list[Any] = []
        self.threads: list[threading.Thread] = []
        self.task_q: Any = ctx.Queue(maxsize=4 * self.n) if self.processes else queue.Queue(maxsize=4 * self.n)
        self.out_q: Any = ctx.Queue() if self.processes else queue.Queue()
        count = buffer_count(cfg, self.n, shape.batch, shape.size)
        for i in range(self.n):
            name = f"{prefix}-r{spec.global_rank}-l{i}" if self.processes else None
            bspec = BufferSpec(name, count, shape.batch, shape.size)
            self.buffers.append(BufferSet(bspec, create=True))
            free_q: Any = ctx.Queue() if self.processes else queue.Queue()
            for b in range(bspec.count):
                free_q.put(b)
            self.free_qs.append(free_q)
            link = LoaderLink(i, self.task_q, free_q, self.out_q)
            if self.processes:
                from gpu_worker.loader import process_main

                p = ctx.Process(
                    target=process_main,
                    name=f"loader-{spec.global_rank}-{i}",
                    daemon=True,
                    args=(link, bspec, cfg, os.getpid()),
                )
                p.start()
                self.procs.append(p)
            else:
                from gpu_worker.loader import Loader

                loader = Loader(link, self.buffers[i], cfg, fetcher=fetcher, alive=lambda: not self._stop.is_set())
                t = threading.Thread(target=loader.run, name=f"loader-{i}", daemon=True)
                t.start()
                self.threads.append(t)

    def put_task(self, task: list[tuple[int, str, str, int]] | None) -> None:
        """Queue a task for the loaders; gives up once they are closed (the model failed to load)."""
        while not self._stop.is_set():
            try:
                self.task_q.put(task, timeout=0.5)
                return
            except queue.Full:
                continue

    def dead(self, done: set[int]) -> list[int]:
        """Loader processes that exited without reporting done."""
        return [i for i, p in enumerate(self.procs) if i not in done and not p.is_alive()]

    def close(self, *, finished: bool = False) -> None:
        """Stop the loaders (those that reported done exit on their own) and free their buffers."""
        self._stop.set()
        for p in self.procs:
            if p.is_alive():
                p.join(timeout=5 if finished else 0.1)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for t in self.threads:
            t.join(timeout=5)
        for q in (self.task_q, self.out_q, *self.free_qs):
            if hasattr(q, "cancel_join_thread"):
                q.cancel_join_thread()
                q.close()
        for b in self.buffers:
            b.close(unlink=self.processes)


def _feed(
    loaders: _Loaders,
    reader_factory: Callable[[], ShardReader],
    remaining: list[intervals.Span],
    retry: list[tuple[int, str]],
    errors: list[BaseException],
) -> None:
    """Feeder thread: the rank's keys (main pass, then earlier attempts' deferred keys), then end marks."""
    try:
        task: list[tuple[int, str, str, int]] = []

        def put(item: tuple[int, str, str, int]) -> None:
            nonlocal task
            task.append(item)
            if len(task) >= TASK_KEYS:
                loaders.put_task(task)
                task = []

        if remaining:
            reader = reader_factory()
            pos = remaining[0][0]
            for bucket, keys in reader.groups(remaining[0][0], remaining[-1][1]):
                for key in keys:
                    if intervals.contains(remaining, pos):
                        put((pos, bucket, key, 0))
                    pos += 1
        for pos, uri in retry:
            bucket, key = parse_s3_uri(uri)
            put((pos, bucket, key, 1))
        if task:
            loaders.put_task(task)
    except BaseException as exc:
        errors.append(exc)
    finally:
        for _ in range(loaders.n):
            loaders.put_task(None)


def run_rank(
    spec: RankSpec, cfg: WorkerConfig, *, store: RunStore | None = None, fetcher: FetcherLike | None = None
) -> dict[str, Any]:
    """Process this rank's slice; returns its summary. Raises WorkerError/RankFailed on failure."""
    started = time.perf_counter()
    plan = RunPlan.model_validate_json(spec.plan_json)
    set_labels(
        run=plan.run_id,
        shard=spec.shard,
        node=spec.node,
        attempt=spec.attempt,
        rank=spec.global_rank,
        local_rank=spec.local_rank,
        world=spec.world,
    )
    rank = _Rank(spec, cfg, plan, store or RunStore(), Stats())
    (lo, hi), todos = _todo(spec)
    # The keys any model still needs: each is fetched and decoded once, for every model that needs it.
    remaining = intervals.normalize(span for t in todos for span in t.remaining)
    retry = sorted({p: u for t in todos for p, u in t.retry}.items())
    summary: dict[str, Any] = {
        "global_rank": spec.global_rank,
        "local_rank": spec.local_rank,
        "slice": [lo, hi],
        "todo": intervals.count(remaining),
        "retry_todo": len(retry),
    }
    logger.info("rank starting", extra=dict(summary))
    if not remaining and not retry:
        summary.update(seconds=0.0, stats={}, chunks=0)
        return summary
    stats = rank.stats
    # Progress beats, and the watchdog that ends this rank when its count stops (gpu_worker.watchdog).
    ids = watchdog.target(plan.run_id, spec.shard, spec.attempt, spec.global_rank)
    dog = watchdog.for_rank(ids, plan.stall_after_s, stats, cfg.beat_interval_s)
    reader_factory = lambda: ShardReader(rank.store.range_source(plan.shard_uri(spec.shard)))  # noqa: E731
    try:
        if plan.content.kind != "image":  # text, video: many parts an object (gpu_worker.kinds)
            return _run_parts(rank, _Work(reader_factory, remaining, retry, todos), fetcher, summary)
        return _pipeline(rank, _Work(reader_factory, remaining, retry, todos), summary, started, fetcher)
    finally:
        dog.stop()


def _pipeline(
    rank: _Rank, work: _Work, summary: dict[str, Any], started: float, fetcher: FetcherLike | None
) -> dict[str, Any]:
    """Build the rank's pipeline (loaders, models) and stream its keys; the rank's summary."""
    stats = rank.stats
    pipe = _build_pipeline(rank, work, fetcher)
    stats.incr("model_ready_seconds", time.perf_counter() - started)
    metrics = _start_metrics(rank, pipe.reasons, pipe.loaders.out_q.qsize)
    t_pipe, window_start = time.perf_counter(), time.time()
    try:
        _stream(pipe, stats)
    finally:
        summary["metrics_series"] = metrics.series()
        metrics.stop()
    t_end = time.perf_counter()
    stats.incr("rank_cpu_seconds", time.process_time())
    summary.update(
        seconds=round(t_end - started, 3),
        models=[e.info.name for e in pipe.engines],
        # From the model being ready to the last commit: the part that runs at the model's rate
        # (the loaders started earlier, while the model loaded).
        pipeline_seconds=round(t_end - t_pipe, 3),
        pipeline_window=[round(window_start, 3), round(window_start + (t_end - t_pipe), 3)],
        chunks=sum(sink.committed for sink in pipe.sinks),
        stats=stats.snapshot(),
        reasons=dict(pipe.reasons),
    )
    logger.info("rank done", extra={k: v for k, v in summary.items() if k != "stats"} | {"stats": summary["stats"]})
    return summary


@dataclass(frozen=True)
class _ModelTodo:
    """What one model still owes in this rank's slice: spans no commit claims yet, deferred (position, uri)."""

    remaining: list[intervals.Span]
    retry: list[tuple[int, str]]


def _todo(spec: RankSpec) -> tuple[tuple[int, int], list[_ModelTodo]]:
    """This rank's slice, and what each model still owes in it."""
    lo, hi = rank_slice(spec.n_keys, spec.world, spec.local_rank)
    todos = []
    for path in spec.state_paths:
        with open(path, "rb") as fh:
            state = ShardState.from_json(fh.read())
        remaining = intervals.subtract([(lo, hi)], state.claimed)
        todos.append(_ModelTodo(remaining, [(p, u) for p, u in state.pending_retry() if lo <= p < hi]))
    return (lo, hi), todos


@dataclass(frozen=True)
class _Work:
    """What the feeder hands the loaders: the rank's remaining spans, then its deferred keys (all models')."""

    reader_factory: Callable[[], ShardReader]
    remaining: list[intervals.Span]
    retry: list[tuple[int, str]]
    todos: list[_ModelTodo]


@dataclass
class _Pipeline:
    """One rank's running parts: loaders fill batches, the engine embeds them, the sink commits chunks."""

    loaders: _Loaders
    engines: list[Any]  # one per model, in the plan's order
    sinks: list[Any]  # each model's ChunkSink
    batch: int
    feeder: threading.Thread
    feed_errors: list[BaseException]
    # Keys failed for good, by reason, counted once however many models owed them (metrics, summary).
    reasons: Counter[str] = field(default_factory=Counter)


def _build_pipeline(rank: _Rank, work: _Work, fetcher: FetcherLike | None) -> _Pipeline:
    """Start the loaders and the feeder, then load the models and open their sinks.

    The loaders and the feeder start first, before this function imports torch: the first GETs
    and decodes run while the models load, trace and dry-run (seconds on CPU), so the models
    have full batches waiting when they are ready (as far as buffer_count allows). With several
    models, images are decoded once at the largest input size; each engine resizes on its device.
    """
    from gpu_worker.modelspec import input_size

    cfg, spec, plan, stats = rank.cfg, rank.spec, rank.plan, rank.stats
    n_loaders, decode_threads, torch_threads = plan_loaders(cfg, spec.device, spec.world)
    batch = cfg.batch_size or min(m.batch_size for m in plan.models)
    sizes = [input_size(path, m.image_size) for path, m in zip(spec.model_paths, plan.models)]
    shape = _PassShape(n_loaders, decode_threads, torch_threads, batch, sizes)
    loaders = _Loaders(rank, shape, fetcher)
    feed_errors: list[BaseException] = []
    feeder = threading.Thread(
        target=_feed,
        args=(loaders, work.reader_factory, work.remaining, work.retry, feed_errors),
        name="feeder",
        daemon=True,
    )
    feeder.start()
    try:
        t0 = time.perf_counter()
        engines, device = _load_engines(rank, shape)
        stats.incr("model_load_seconds", time.perf_counter() - t0)
        stats.incr("prefetched_batches", loaders.out_q.qsize())
        sinks = [_open_sink(rank, m, todo, engine) for m, (todo, engine) in enumerate(zip(work.todos, engines))]
    except BaseException:
        loaders.close()
        raise
    logger.info(
        "model ready",
        extra={
            "model": engines[0].info.name,
            "models": [e.info.name for e in engines],
            "dim": engines[0].output_dim,
            "device": device,
            "batch_size": batch,
            "image_size": shape.size,
            "loaders": n_loaders,
            "decode_threads": decode_threads,
            "torch_threads": torch_threads,
            "prefetched_batches": int(stats.snapshot().get("prefetched_batches", 0)),
        },
    )
    return _Pipeline(loaders, engines, sinks, batch, feeder, feed_errors)


def _open_sink(rank: _Rank, m: int, todo: _ModelTodo, engine: Any) -> Any:
    """Model `m`'s ChunkSink: its own windows, markers and output folder (RunPlan.model_output_prefix)."""
    from gpu_worker.sink import ChunkSink, RecordLabel, SinkSpec

    cfg, plan, spec = rank.cfg, rank.plan, rank.spec
    planned = plan.models[m]
    sink = SinkSpec(
        rank=spec.global_rank,
        attempt=spec.attempt,
        windows=intervals.cut(todo.remaining, cfg.chunk_keys),
        chunk_keys=cfg.chunk_keys,
        dtype=cfg.output_dtype or plan.output_dtype,
        metadata={
            "model": planned.uri,
            "dim": str(engine.output_dim),
            "run": plan.run_id,
            "shard": str(spec.shard),
        },
        label=RecordLabel(planned.name, engine.info.version, planned.model_id, plan.run_id),
        retry=[p for p, _ in todo.retry],
    )
    paths = Paths.for_shard(plan.model_output_prefix(m), plan.failures_prefix, plan.shards_prefix, spec.shard)
    return ChunkSink(rank.store, paths, sink, observer=rank.stats)


def _load_engines(rank: _Rank, shape: _PassShape) -> tuple[list[Any], str]:
    """(each model on its device, traced and dry-run on batches of the pass's decoded size; the device name)."""
    import torch

    from gpu_worker.errors import ConfigError
    from gpu_worker.infer import Engine, EngineOptions
    from gpu_worker.model import load_model

    spec, cfg = rank.spec, rank.cfg
    torch.set_num_threads(shape.torch_threads)
    device = "cpu"
    if spec.device == "cuda":
        torch.cuda.set_device(spec.local_rank)
        device = f"cuda:{spec.local_rank}"
    options = EngineOptions(autocast=cfg.autocast, jit=cfg.jit, input_size=shape.size)
    engines = []
    for path, planned, want in zip(spec.model_paths, rank.plan.models, shape.sizes):
        model, info = load_model(path, planned.image_size)
        if info.image_size != want:  # modelspec and load_model read the same spec: a mismatch is a bug
            raise ConfigError(f"model {info.name}: input size {info.image_size}, but its spec file said {want}")
        engines.append(Engine(model, info, device, shape.batch, options, observer=MetricsObserver(rank.stats)))
    return engines, device


def _stream(pipe: _Pipeline, stats: Stats) -> None:
    """Run every batch through the models into their sinks, commit the last chunks.

    On any failure no sink commits anything more; the loaders are stopped either way.
    """
    ok = False
    try:
        _consume(pipe, stats, pipe.feed_errors)
        for m, engine in enumerate(pipe.engines):
            for msg, emb in engine.drain():
                _rows(pipe.sinks[m], msg, emb)
        for sink in pipe.sinks:
            sink.close()
        ok = True
    finally:
        if not ok:
            for sink in pipe.sinks:
                sink.abort()
        pipe.loaders.close(finished=ok)


def _rows(sink: Any, msg: BatchMsg, emb: Any) -> None:
    """A batch's embeddings from one model to its sink: the rows that model still owes (all, unless resumed)."""
    keep = [i for i in range(msg.n) if sink.owns(msg.positions[i], msg.phases[i])]
    if len(keep) == msg.n:
        sink.add_rows(msg.positions, msg.uris, msg.phases, emb[: msg.n], msg.objs)
    elif keep:
        sink.add_rows(
            [msg.positions[i] for i in keep],
            [msg.uris[i] for i in keep],
            [msg.phases[i] for i in keep],
            emb[keep],
            [msg.objs[i] for i in keep],
        )


def _start_metrics(rank: _Rank, reasons: Counter[str], queue_depth: Callable[[], int]) -> RankMetrics:
    """This rank's registry: served on /metrics (port + local rank) and pushed to AMP when configured."""
    cfg, plan, spec = rank.cfg, rank.plan, rank.spec
    env = ContainerEnv.from_env()
    labels = {
        "run_id": plan.run_id,
        "shard": str(spec.shard),
        "node": str(spec.node),
        "rank": str(spec.global_rank),
        "gpu": str(spec.local_rank) if spec.device == "cuda" else "",
        "attempt": str(spec.attempt),
        "instance_type": instance_type(env.instance_type),
        "kind": plan.content.kind,  # one value a run: no more series
    }
    collector = RankCollector(
        rank.stats.snapshot,
        labels,
        reasons=lambda: dict(reasons),
        queue_depth=queue_depth,
        gpu=GpuProbe(spec.local_rank if spec.device == "cuda" else None),
    )
    return RankMetrics(
        collector,
        port=cfg.metrics_port + spec.local_rank if cfg.metrics_port else 0,
        remote_write_url=env.remote_write_url or (plan.remote_write_url or ""),
        push=PushPolicy(interval_s=cfg.push_interval_s, keep=keep_list(cfg.push_metrics)),
    )


def _keys(work: _Work) -> Iterator[tuple[int, str, str, int]]:
    """The rank's keys as (position, bucket, key, phase): its remaining spans, then the deferred keys."""
    remaining = work.remaining
    if remaining:
        pos = remaining[0][0]
        for bucket, keys in work.reader_factory().groups(remaining[0][0], remaining[-1][1]):
            for key in keys:
                if intervals.contains(remaining, pos):
                    yield pos, bucket, key, 0
                pos += 1
    for pos, uri in work.retry:
        bucket, key = parse_s3_uri(uri)
        yield pos, bucket, key, 1


def _run_parts(rank: _Rank, work: _Work, fetcher: FetcherLike | None, summary: dict[str, Any]) -> dict[str, Any]:
    """A rank of a text or video run (gpu_worker.kinds.parts): the image path's sinks, metrics and summary."""
    from gpu_worker.kinds.parts import parts_pass, run_parts

    started, window_start = time.perf_counter(), time.time()
    embedders = _load_embedders(rank)
    rank.stats.incr("model_ready_seconds", time.perf_counter() - started)  # the watchdog's load grace ends
    batch = rank.cfg.batch_size or min(m.batch_size for m in rank.plan.models)
    run = parts_pass(rank.cfg, embedders, lambda m, e: _open_sink(rank, m, work.todos[m], e), rank.stats, batch)
    metrics = _start_metrics(rank, run.reasons, lambda: 0)
    ok = False
    try:
        run_parts(run, _keys(work), fetcher)
        for sink in run.sinks:
            sink.close()
        ok = True
    finally:
        if not ok:
            for sink in run.sinks:
                sink.abort()
        summary["metrics_series"] = metrics.series()
        metrics.stop()
    took = time.perf_counter() - started
    rank.stats.incr("rank_cpu_seconds", time.process_time())
    summary.update(
        seconds=round(took, 3),
        models=[e.info.name for e in embedders],
        pipeline_seconds=round(took, 3),
        pipeline_window=[round(window_start, 3), round(window_start + took, 3)],
        chunks=sum(sink.committed for sink in run.sinks),
        stats=rank.stats.snapshot(),
        reasons=dict(run.reasons),
    )
    logger.info("rank done", extra={k: v for k, v in summary.items() if k != "stats"} | {"stats": summary["stats"]})
    return summary


def _load_embedders(rank: _Rank) -> list[Any]:
    """Each model of a text or video run on the rank's device (gpu_worker.kinds.load_embedder)."""
    import torch

    from gpu_worker.kinds.base import Loading
    from gpu_worker.kinds.load import load_embedder

    spec, cfg, plan = rank.spec, rank.cfg, rank.plan
    torch.set_num_threads(plan_loaders(cfg, spec.device, spec.world)[2])
    device = f"cuda:{spec.local_rank}" if spec.device == "cuda" else "cpu"
    if spec.device == "cuda":
        torch.cuda.set_device(spec.local_rank)
    batch = cfg.batch_size or min(m.batch_size for m in plan.models)
    t0 = time.perf_counter()
    loads = [Loading(p, m, plan.content, device, batch, cfg) for p, m in zip(spec.model_paths, plan.models)]
    out = [load_embedder(how) for how in loads]
    rank.stats.incr("model_load_seconds", time.perf_counter() - t0)
    return out


def _next_message(loaders: _Loaders, stats: Stats, done: set[int], feed_errors: list[BaseException]) -> Any:
    """The next loader message, or None after a quiet poll (which checks the feeder and the loaders)."""
    t0 = time.perf_counter()
    try:
        return loaders.out_q.get(timeout=0.5)
    except queue.Empty:
        if feed_errors:
            raise WorkerError(f"reading the shard failed: {feed_errors[0]}") from feed_errors[0]
        dead = loaders.dead(done)
        if dead:
            raise RankFailed(f"loader process {dead[0]} died (exit code {loaders.procs[dead[0]].exitcode})") from None
        return None
    finally:
        stats.incr("wait_seconds", time.perf_counter() - t0)


def _consume(pipe: _Pipeline, stats: Stats, feed_errors: list[BaseException]) -> None:
    """Handle loader messages until every loader is done: batches to the models, failures to the sinks."""
    import torch

    loaders, sinks = pipe.loaders, pipe.sinks
    done: set[int] = set()
    started = time.perf_counter()
    first = True
    while len(done) < loaders.n:
        msg = _next_message(loaders, stats, done, feed_errors)
        if msg is None:
            continue
        if isinstance(msg, BatchMsg):
            if first:
                stats.incr("first_batch_seconds", time.perf_counter() - started)
                first = False
            stats.add(msg.stats)
            host = torch.from_numpy(loaders.buffers[msg.loader].array(msg.buffer))
            finished = [(m, engine.submit(host, msg)) for m, engine in enumerate(pipe.engines)]
            del host
            loaders.free_qs[msg.loader].put(msg.buffer)
            stats.incr("batches")
            stats.incr("images", msg.n)
            stats.incr("padded_slots", pipe.batch - msg.n)
            for m, results in finished:
                for tag, emb in results:
                    _rows(sinks[m], tag, emb)
        elif isinstance(msg, FailMsg):
            owners = [sink for sink in sinks if sink.owns(msg.pos, msg.phase)]
            for sink in owners:
                if msg.obj is not None:  # the failure names the version whose bytes failed
                    sink.read_as(msg.pos, msg.obj)
                sink.add_failure(msg.pos, msg.uri, msg.phase, msg.reason, msg.detail, msg.deferred)
            if owners and not msg.deferred:
                pipe.reasons[msg.reason] += 1
        elif isinstance(msg, DoneMsg):
            done.add(msg.loader)
            stats.add(msg.stats)
        elif isinstance(msg, ErrorMsg):
            raise RankFailed(msg.message)
        else:  # pragma: no cover
            raise WorkerError(f"unknown loader message {type(msg).__name__}")


def main(argv: list[str] | None = None) -> int:
    """`python -m gpu_worker.rank SPEC.json`: one rank process of a multi-rank node."""
    argv = sys.argv[1:] if argv is None else argv
    die_with_parent()
    with open(argv[0]) as fh:
        spec = RankSpec(**json.load(fh))
    try:
        cfg = WorkerConfig.from_env()
        setup(cfg.log_level)
        summary = run_rank(spec, cfg)
    except Exception as exc:
        return report(exc, f"sluice-worker rank {spec.global_rank}", role="rank")
    with open(spec.summary_path, "w") as fh:
        json.dump(summary, fh)
    return 0


def spec_json(spec: RankSpec) -> str:
    return json.dumps(asdict(spec))


if __name__ == "__main__":
    sys.exit(main())
