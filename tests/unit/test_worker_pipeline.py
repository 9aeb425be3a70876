"""The loader pipeline (threads, fake fetcher): out-of-order batches, deferral and the final pass."""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest

from gpu_worker.config import WorkerConfig
from gpu_worker.errors import ObjectFailure, WorkerError
from gpu_worker.passes.buffers import BufferSet, BufferSpec
from gpu_worker.passes.keys import KeyFailure
from gpu_worker.passes.loader import BatchMsg, DoneMsg, ErrorMsg, FailMsg, Loader, LoaderLink
from gpu_worker.telemetry.stats import Stats
from sluice.contracts.status import FailureReason
from tests.worker_images import make_demo_images

IMAGES = dict(make_demo_images(40, seed=3))
NAMES = sorted(IMAGES)
GUARD = 30  # seconds: only so that a broken pipeline fails instead of hanging


class FakeFetcher:
    """Serves IMAGES; `gates` block keys until released; `transient` keys fail (non-final calls only,
    or always when listed in `dead`)."""

    def __init__(
        self,
        gates: dict[str, threading.Event] | None = None,
        transient: set[str] | None = None,
        dead: set[str] | None = None,
    ) -> None:
        self.gates = gates or {}
        self.transient = transient or set()
        self.dead = dead or set()
        self.calls: list[tuple[str, bool]] = []
        self._lock = threading.Lock()

    def get(self, bucket: str, key: str, *, final: bool = False) -> bytes:
        with self._lock:
            self.calls.append((key, final))
        if key in self.gates:
            assert self.gates[key].wait(GUARD)
        if key in self.dead or (key in self.transient and not final):
            raise ObjectFailure(FailureReason.S3_ERROR_TRANSIENT, "SlowDown", transient=True)
        if key not in IMAGES:
            raise ObjectFailure(FailureReason.MISSING, "NoSuchKey")
        return IMAGES[key]


def start(fetcher: Any, keys: list[str], *, batch: int = 4, concurrency: int = 4, **cfg: Any):
    config = WorkerConfig(fetch_concurrency=concurrency, decode_threads=2, final_backoff_base_s=0.0, **cfg)
    buffers = BufferSet(BufferSpec(None, 2, batch, 16), create=True)
    task_q: queue.Queue[Any] = queue.Queue()
    free_q: queue.Queue[int] = queue.Queue()
    out_q: queue.Queue[Any] = queue.Queue()
    for b in range(2):
        free_q.put(b)
    task_q.put([(i, "bucket", k, 0) for i, k in enumerate(keys)])
    task_q.put(None)
    loader = Loader(LoaderLink(0, task_q, free_q, out_q), buffers, config, fetcher=fetcher)
    thread = threading.Thread(target=loader.run, daemon=True)
    thread.start()
    return out_q, free_q, buffers, thread


def drain(out_q: queue.Queue[Any], free_q: queue.Queue[int], until_done: bool = True, batches: int = 0):
    """Messages until DoneMsg (or until `batches` batch messages), returning buffers as a rank would."""
    got: list[Any] = []
    while True:
        msg = out_q.get(timeout=GUARD)
        got.append(msg)
        if isinstance(msg, BatchMsg):
            free_q.put(msg.buffer)
            if batches and sum(isinstance(m, BatchMsg) for m in got) == batches:
                return got
        if isinstance(msg, DoneMsg | ErrorMsg):
            return got


def test_a_slow_object_does_not_hold_back_the_batches_behind_it():
    gate = threading.Event()
    slow = NAMES[0]
    out_q, free_q, _, thread = start(FakeFetcher({slow: gate}), NAMES[:21], batch=4)
    # Positions 1..20 fill five whole batches while position 0 is still being fetched.
    early = drain(out_q, free_q, batches=5)
    positions = [p for m in early if isinstance(m, BatchMsg) for p in m.positions]
    assert sorted(positions) == list(range(1, 21))
    gate.set()
    rest = drain(out_q, free_q)
    assert [m.positions for m in rest if isinstance(m, BatchMsg)] == [[0]]  # the flushed partial batch
    assert isinstance(rest[-1], DoneMsg)
    thread.join(GUARD)


def test_batch_slots_hold_the_decoded_image_of_their_key():
    from gpu_worker.decode.image import decode_image

    out_q, free_q, buffers, _ = start(FakeFetcher(), NAMES[:10], batch=4)
    checked = 0
    while True:
        msg = out_q.get(timeout=GUARD)
        if isinstance(msg, DoneMsg):
            break
        assert isinstance(msg, BatchMsg)
        for slot, (pos, uri) in enumerate(zip(msg.positions[: msg.n], msg.uris)):
            assert uri == f"s3://bucket/{NAMES[pos]}"
            assert (buffers.array(msg.buffer)[slot] == decode_image(IMAGES[NAMES[pos]], 16, 10**8)).all()
            checked += 1
        free_q.put(msg.buffer)
    assert checked == 10


def test_transient_keys_are_deferred_then_settled_by_the_final_pass():
    flaky, dead = NAMES[2], NAMES[5]
    fetcher = FakeFetcher(transient={flaky}, dead={dead})
    keys = [*NAMES[:8], "missing.jpg"]
    out_q, free_q, _, _ = start(fetcher, keys, batch=4)
    msgs = drain(out_q, free_q)
    fails = [
        (m.failure.uri.rsplit("/", 1)[1], m.failure.item[3], m.failure.reason, m.failure.deferred)
        for m in msgs
        if isinstance(m, FailMsg)
    ]
    # (key, phase, reason, deferred): both transient keys deferred in the main pass (phase 0) ...
    assert (flaky, 0, "s3_error_transient", True) in fails
    assert (dead, 0, "s3_error_transient", True) in fails
    assert ("missing.jpg", 0, "missing", False) in fails
    # ... the dead one fails for good in the final pass (phase 1), the flaky one is embedded there.
    assert (dead, 1, "s3_error_transient", False) in fails
    assert len(fails) == 4
    rows = {(u.rsplit("/", 1)[1], ph) for m in msgs if isinstance(m, BatchMsg) for u, ph in zip(m.uris, m.phases)}
    assert (flaky, 1) in rows
    assert {k for k, _ in rows} == set(NAMES[:8]) - {dead}
    assert sorted(c for c in fetcher.calls if c[1]) == sorted([(dead, True), (flaky, True)])
    assert isinstance(msgs[-1], DoneMsg)
    totals = Stats()
    for m in msgs:
        totals.add(m.stats if isinstance(m, BatchMsg | DoneMsg) else {})
    assert totals.get("s3_deferred") == 2


def test_a_fatal_fetch_error_is_reported_not_swallowed():
    class Broken(FakeFetcher):
        def get(self, bucket: str, key: str, *, final: bool = False) -> bytes:
            raise WorkerError("no AWS credentials for S3")

    out_q, free_q, _, _ = start(Broken(), NAMES[:6])
    msgs = drain(out_q, free_q)
    assert isinstance(msgs[-1], ErrorMsg) and "credentials" in msgs[-1].message


@pytest.mark.parametrize("n", [1, 4, 7])
def test_every_key_settles_exactly_once(n):
    keys = [*NAMES[:n], "missing-a", "missing-b"]
    out_q, free_q, _, _ = start(FakeFetcher(), keys, batch=3, concurrency=2)
    msgs = drain(out_q, free_q)
    settled = [p for m in msgs if isinstance(m, BatchMsg) for p in m.positions]
    settled += [m.failure.item[0] for m in msgs if isinstance(m, FailMsg)]
    assert sorted(settled) == list(range(len(keys)))


def test_messages_pickle_through_process_queues():
    import pickle

    for msg in (
        BatchMsg(
            1, 0, 2, [3, 4], ["s3://b/a", "s3://b/b"], [0, 1], [("e1", None, 3), ("e2", "v", 4)], {"decoded": 2.0}
        ),
        FailMsg(1, KeyFailure((5, "b", "c", 0), "missing", "NoSuchKey", False, ("e", None))),
        DoneMsg(1, {"s3_gets": 3.0}),
        ErrorMsg(1, "loader 1: boom", "Traceback ..."),
    ):
        back = pickle.loads(pickle.dumps(msg))
        assert back == msg and type(back) is type(msg)
