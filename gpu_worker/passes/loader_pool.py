"""The image pass's loader pool for one rank: how many loaders, their batch buffers and queues, the feeder.

Module-level imports stay torch-free: loader processes are spawned from the rank and import
gpu_worker.passes.loader_loop, and they must not pay for (or hold memory of) torch.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from gpu_worker.config import WorkerConfig
from gpu_worker.decode.nvjpeg import rank_decode_cfg
from gpu_worker.decode.preprocess import Preprocess
from gpu_worker.passes.buffers import BufferSet, BufferSpec
from gpu_worker.passes.keys import Item
from gpu_worker.passes.loader_loop import Loader, LoaderLink, process_main
from gpu_worker.passes.work import RankContext
from gpu_worker.procs import cpu_count, shm_prefix

TASK_KEYS = 32  # keys per task message to the loaders


class RankThreads(NamedTuple):
    """How a rank divides its CPUs: loader processes (0: one loader thread), decodes per loader, torch threads."""

    loaders: int
    decode_threads: int
    torch_threads: int


def plan_loaders(cfg: WorkerConfig, device: str, world: int) -> RankThreads:
    """The rank's loaders, decode threads and torch threads (settings win over the automatic choice)."""
    per_rank = max(1, cpu_count() // world)
    # GPU: decode needs more than one GIL, so loader processes. CPU: the model's threads already
    # hold every core, and a second process costs more than the GIL (docs/performance.md).
    auto = max(1, min(8, per_rank - 1)) if device == "cuda" else 0
    loaders = cfg.loaders if cfg.loaders >= 0 else auto
    decode = cfg.decode_threads or max(1, per_rank // max(1, loaders))
    torch_threads = cfg.torch_threads or (min(4, per_rank) if device == "cuda" else per_rank)
    return RankThreads(loaders, decode, torch_threads)


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
class LoaderShape:
    """The loaders of one image pass: their threads, and the batches they fill."""

    threads: RankThreads
    batch: int  # images per model step, the same for every model of the pass
    prep: Preprocess  # how images are decoded: every model's, or the legacy one at the largest side any needs

    @property
    def size(self) -> int:
        """The side images are decoded at."""
        return self.prep.size


class RankLoaders:
    """The rank's loaders (threads or processes) and their queues and buffers."""

    def __init__(self, ctx: RankContext, shape: LoaderShape) -> None:
        spec, n = ctx.spec, shape.threads.loaders
        cfg = ctx.cfg.replace(decode_threads=shape.threads.decode_threads)
        cfg = rank_decode_cfg(cfg, ctx.plan, spec.torch_device, ctx.stats)  # JPEGs on the GPU: decode.nvjpeg
        self.n = max(1, n)
        self.processes = n > 0
        self._stop = threading.Event()
        self._ctx = mp.get_context("spawn")
        self._rank = spec.global_rank
        self.buffers: list[BufferSet] = []
        self.free_qs: list[Any] = []
        self.procs: list[Any] = []
        self.threads: list[threading.Thread] = []
        self.task_q: Any = self._queue(maxsize=4 * self.n)
        self.out_q: Any = self._queue()
        count = buffer_count(cfg, self.n, shape.batch, shape.size)
        prefix = shm_prefix(ctx.plan.run_id, spec.shard)
        for i in range(self.n):
            name = f"{prefix}-r{spec.global_rank}-l{i}" if self.processes else None
            self._start(i, BufferSpec(name, count, shape.batch, shape.size, shape.prep), cfg)

    def _queue(self, maxsize: int = 0) -> Any:
        return self._ctx.Queue(maxsize) if self.processes else queue.Queue(maxsize)

    def _start(self, i: int, bspec: BufferSpec, cfg: WorkerConfig) -> None:
        """Loader i: its buffers (every one free), then its process or thread."""
        self.buffers.append(BufferSet(bspec, create=True))
        free_q = self._queue()
        for b in range(bspec.count):
            free_q.put(b)
        self.free_qs.append(free_q)
        link = LoaderLink(i, self.task_q, free_q, self.out_q)
        if self.processes:
            args = (link, bspec, cfg, os.getpid())
            p = self._ctx.Process(target=process_main, name=f"loader-{self._rank}-{i}", daemon=True, args=args)
            p.start()
            self.procs.append(p)
            return
        loader = Loader(link, self.buffers[i], cfg, alive=lambda: not self._stop.is_set())
        t = threading.Thread(target=loader.run, name=f"loader-{i}", daemon=True)
        t.start()
        self.threads.append(t)

    def put_task(self, task: list[Item] | None) -> None:
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


def feed(loaders: RankLoaders, keys: Iterable[Item], errors: list[BaseException]) -> None:
    """Feeder thread: the rank's keys to the loaders in tasks of TASK_KEYS, then one end mark per loader."""
    try:
        task: list[Item] = []
        for item in keys:
            task.append(item)
            if len(task) >= TASK_KEYS:
                loaders.put_task(task)
                task = []
        if task:
            loaders.put_task(task)
    except BaseException as exc:
        errors.append(exc)
    finally:
        for _ in range(loaders.n):
            loaders.put_task(None)
