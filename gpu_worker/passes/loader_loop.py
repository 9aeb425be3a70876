"""A loader: fetch pool + decode threads + batch assembly, feeding one rank.

A loader pulls tasks (lists of Items: position, bucket, key, phase) from the rank's task queue,
keeps up to `fetch_concurrency` GETs in flight (fewer while `max_inflight_bytes` of fetched
bytes wait for decoding), decodes with at most `decode_threads` concurrent Pillow decodes,
and writes each image into the next free slot of its current batch buffer, in COMPLETION
order: a slow or failing object holds only its own slot, never the batch behind it. A full
buffer is announced to the rank, which hands it back after the model step.

Keys that stay transient after the immediate retries are deferred; when the task stream
ends, the loader runs its final retry pass over them (phase 1 results), flushes its partial
batch and reports done. Loaders run as processes (default: own GIL, shared-memory buffers)
or as threads inside the rank (SLUICE_WORKER_LOADERS=0).
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from gpu_worker.config import WorkerConfig
from gpu_worker.decode.nvjpeg import loader_decode
from gpu_worker.errors import WorkerError
from gpu_worker.passes.buffers import BufferSet, BufferSpec
from gpu_worker.passes.keys import Got, Item, KeyFailure, final_backoff, take
from gpu_worker.procs import die_with_parent
from gpu_worker.sources.fetch import Fetcher, ObjMeta
from gpu_worker.telemetry.observe import MetricsObserver
from gpu_worker.telemetry.stats import Stats

POLL_S = 0.5


# ---- messages from a loader to its rank (they cross multiprocessing queues: plain, picklable) ----


class BatchMsg(NamedTuple):
    """Buffer `buffer` of loader `loader` holds `n` images, for these positions, uris, phases and objects."""

    loader: int
    buffer: int
    n: int
    positions: list[int]
    uris: list[str]
    phases: list[int]
    objs: list[ObjMeta]
    stats: dict[str, float]  # the loader's counters since its previous message


class FailMsg(NamedTuple):
    """One key produced no image (gpu_worker.passes.base.KeyFailure)."""

    loader: int
    failure: KeyFailure


class DoneMsg(NamedTuple):
    """The loader's stream ended and every batch was sent."""

    loader: int
    stats: dict[str, float]


class ErrorMsg(NamedTuple):
    """The loader hit something fatal (credentials, a bug); the rank fails."""

    loader: int
    message: str
    traceback: str


LoaderMsg = BatchMsg | FailMsg | DoneMsg | ErrorMsg


class Queue(Protocol):
    def put(self, item: Any) -> None: ...

    def get(self, block: bool = True, timeout: float | None = None) -> Any: ...


def _always() -> bool:
    return True


class Stopped(Exception):
    """The rank went away or asked us to stop."""


@dataclass(frozen=True)
class LoaderLink:
    """The queues between one loader and its rank (picklable: a loader process gets it at spawn)."""

    loader_id: int
    task_q: Queue  # lists of Items from the rank's feeder; None ends the stream
    free_q: Queue  # indexes of the loader's batch buffers the rank handed back
    out_q: Queue  # LoaderMsg to the rank


class Loader:
    """Fills one loader's batch buffers from its task queue (see the module docstring).

    Its GETs go through its own Fetcher (the data-plane client), observed into its own counters
    (shipped to the rank with each message). `alive` says whether the rank is still there.
    """

    def __init__(
        self,
        link: LoaderLink,
        buffers: BufferSet,
        cfg: WorkerConfig,
        *,
        alive: Callable[[], bool] | None = None,
        own_process: bool = False,
    ) -> None:
        self._own_process = own_process
        self.id = link.loader_id
        self._cfg = cfg
        self._buffers = buffers
        self._task_q, self._free_q, self._out_q = link.task_q, link.free_q, link.out_q
        self._stats = Stats()
        self._fetcher = Fetcher(cfg, observer=MetricsObserver(self._stats))
        self._alive = alive or _always
        self._decode = loader_decode(cfg, buffers.spec.preprocess)  # Pillow, or GPU batches (decode.nvjpeg)
        self._cond = threading.Condition()
        self._inflight = 0
        self._held = 0
        self._fatal: str | None = None
        self._deferred: list[Item] = []
        self._decode_sem = threading.BoundedSemaphore(max(1, cfg.decode_threads))
        # batch assembly state (guarded by _asm)
        self._asm = threading.Condition()
        self._cur: int | None = None
        self._fill = 0
        self._getting = False
        self._meta: tuple[list[int], list[str], list[int], list[ObjMeta]] = ([], [], [], [])

    # -- queue helpers -------------------------------------------------------------------
    def _get(self, q: Queue) -> Any:
        while True:
            if self._fatal:
                raise Stopped(self._fatal)
            try:
                return q.get(timeout=POLL_S)
            except queue.Empty:
                if not self._alive():
                    raise Stopped("rank is gone") from None

    def _send(self, msg: LoaderMsg) -> None:
        self._out_q.put(msg)

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        """Process tasks until the stream ends; always ends with a DoneMsg or an ErrorMsg."""
        try:
            self._fetcher.warm()  # build the S3 client before the first task, not on the critical path
            with ThreadPoolExecutor(self._cfg.fetch_concurrency, thread_name_prefix=f"fetch{self.id}") as pool:
                try:
                    self._stream(pool)
                finally:
                    self._wait_idle(strict=False)
            if self._fatal:
                raise WorkerError(self._fatal)
            self._flush()
            if self._own_process:  # report the loader process's CPU time
                self._stats.incr("loader_cpu_seconds", time.process_time())
            self._send(DoneMsg(self.id, self._stats.take_delta()))
        except Stopped:
            if self._fatal:  # a fetch thread hit something fatal (credentials, a bug): tell the rank
                self._send(ErrorMsg(self.id, self._fatal, ""))
        except BaseException as exc:
            msg = self._fatal or f"loader {self.id}: {type(exc).__name__}: {exc}"
            self._send(ErrorMsg(self.id, msg, traceback.format_exc()))

    def _stream(self, pool: ThreadPoolExecutor) -> None:
        while True:
            task = self._get(self._task_q)
            if task is None:
                break
            for item in task:
                self._submit(pool, item, final=False)
        self._wait_idle()
        if self._deferred:
            items, self._deferred = self._deferred, []
            final_backoff(self._cfg.final_backoff_base_s)
            for item in items:
                self._submit(pool, item, final=True)
            self._wait_idle()

    def _submit(self, pool: ThreadPoolExecutor, item: Item, *, final: bool) -> None:
        cfg = self._cfg
        with self._cond:
            while self._inflight >= cfg.fetch_concurrency or self._held >= cfg.max_inflight_bytes:
                if self._fatal:
                    raise Stopped(self._fatal)
                self._cond.wait(POLL_S)
            self._inflight += 1
        pool.submit(self._one, item, final)

    def _wait_idle(self, strict: bool = True) -> None:
        with self._cond:
            while self._inflight > 0:
                if strict and self._fatal:
                    raise Stopped(self._fatal)
                self._cond.wait(POLL_S)

    # -- one object ----------------------------------------------------------------------
    def _one(self, item: Item, final: bool) -> None:
        try:
            got = take(self._fetcher, item, final, self._decode_held, self._stats)
            if isinstance(got, KeyFailure):
                if got.deferred:
                    with self._cond:
                        self._deferred.append(got.item)
                self._send(FailMsg(self.id, got))
                return
            self._stats.incr("decoded")
            self._place(got)
        except Stopped:
            pass
        except BaseException as exc:
            with self._cond:
                self._fatal = self._fatal or f"loader {self.id}: {type(exc).__name__}: {exc}"
        finally:
            with self._cond:
                self._inflight -= 1
                self._cond.notify_all()

    def _decode_held(self, data: bytes) -> Any:
        """Decode fetched bytes; they count against max_inflight_bytes until decoded (fetching pauses above it)."""
        with self._holding(len(data)), self._decode_sem:
            return self._decode(data)

    @contextlib.contextmanager
    def _holding(self, n: int) -> Iterator[None]:
        with self._cond:
            self._held += n
        try:
            yield
        finally:
            with self._cond:
                self._held -= n
                self._cond.notify_all()

    # -- batch assembly ------------------------------------------------------------------
    def _place(self, got: Got[Any]) -> None:
        item = got.item
        with self._asm:
            while self._cur is None:
                if self._getting:
                    self._asm.wait(POLL_S)
                    if self._fatal:
                        raise Stopped(self._fatal)
                    continue
                self._getting = True
                self._asm.release()
                try:
                    idx = self._get(self._free_q)
                finally:
                    self._asm.acquire()
                    self._getting = False
                self._cur, self._fill = idx, 0
                self._asm.notify_all()
            self._buffers.array(self._cur)[self._fill] = got.value
            self._fill += 1
            self._meta[0].append(item.pos)
            self._meta[1].append(item.uri)
            self._meta[2].append(item.phase)
            self._meta[3].append(got.obj)
            if self._fill == self._buffers.spec.batch_size:
                self._emit()

    def _emit(self) -> None:
        assert self._cur is not None
        positions, uris, phases, objs = self._meta
        self._send(BatchMsg(self.id, self._cur, self._fill, positions, uris, phases, objs, self._stats.take_delta()))
        self._cur, self._fill, self._meta = None, 0, ([], [], [], [])

    def _flush(self) -> None:
        with self._asm:
            if self._cur is not None and self._fill:
                self._emit()


def process_main(link: LoaderLink, buffers: BufferSpec, cfg: WorkerConfig, parent_pid: int) -> None:
    """Entry point of a loader process (spawned by its rank): attaches to its buffers, runs until done."""
    die_with_parent(parent_pid)
    if cfg.loader_nice:
        with contextlib.suppress(OSError):
            os.nice(cfg.loader_nice)
    attached = BufferSet(buffers, create=False)
    try:
        Loader(link, attached, cfg, alive=lambda: os.getppid() == parent_pid, own_process=True).run()
    finally:
        attached.close()
