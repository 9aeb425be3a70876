"""The loader pipeline (threads; the images on moto's S3, the GETs held or throttled there): out-of-order batches,
deferral and the final pass."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest

from gpu_worker.config import WorkerConfig
from gpu_worker.passes.buffers import BufferSet, BufferSpec
from gpu_worker.passes.keys import Item, KeyFailure
from gpu_worker.passes.loader_loop import BatchMsg, DoneMsg, ErrorMsg, FailMsg, Loader, LoaderLink
from gpu_worker.telemetry.stats import Stats
from tests.worker_gets import GUARD, Gets, moto_objects
from tests.worker_images import make_demo_images

IMAGES = dict(make_demo_images(40, seed=3))
NAMES = sorted(IMAGES)


@pytest.fixture(autouse=True)
def images() -> Iterator[Any]:
    """IMAGES in the bucket "bucket" of moto's S3."""
    yield from moto_objects("bucket", IMAGES)


@pytest.fixture
def gets() -> Iterator[ExitStack]:
    """Where a test's Gets are entered (they leave with it)."""
    with ExitStack() as stack:
        yield stack


def config(concurrency: int = 4) -> WorkerConfig:
    """The loader's settings: one GET a key in the main pass, one in the final pass, no backoff."""
    return WorkerConfig(
        fetch_concurrency=concurrency, decode_threads=2, retries=0, final_retries=1, final_backoff_base_s=0.0
    )


def start(keys: list[str], *, batch: int = 4, concurrency: int = 4):
    buffers = BufferSet(BufferSpec(None, 2, batch, 16), create=True)
    task_q: queue.Queue[Any] = queue.Queue()
    free_q: queue.Queue[int] = queue.Queue()
    out_q: queue.Queue[Any] = queue.Queue()
    for b in range(2):
        free_q.put(b)
    task_q.put([Item(i, "bucket", k, 0) for i, k in enumerate(keys)])
    task_q.put(None)
    loader = Loader(LoaderLink(0, task_q, free_q, out_q), buffers, config(concurrency))
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


def test_a_slow_object_does_not_hold_back_the_batches_behind_it(gets):
    gate = threading.Event()
    slow = NAMES[0]
    gets.enter_context(Gets(config(), gates={slow: gate}))
    out_q, free_q, _, thread = start(NAMES[:21], batch=4)
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
    from gpu_worker.decode.preprocess import legacy

    out_q, free_q, buffers, _ = start(NAMES[:10], batch=4)
    checked = 0
    while True:
        msg = out_q.get(timeout=GUARD)
        if isinstance(msg, DoneMsg):
            break
        assert isinstance(msg, BatchMsg)
        for slot, (pos, uri) in enumerate(zip(msg.positions[: msg.n], msg.uris)):
            assert uri == f"s3://bucket/{NAMES[pos]}"
            assert (buffers.array(msg.buffer)[slot] == decode_image(IMAGES[NAMES[pos]], legacy(16), 10**8)).all()
            checked += 1
        free_q.put(msg.buffer)
    assert checked == 10


def test_transient_keys_are_deferred_then_settled_by_the_final_pass(gets):
    flaky, dead = NAMES[2], NAMES[5]
    # S3 throttles the flaky key's first GET (the main pass's), the dead key's every GET.
    log = gets.enter_context(Gets(config(), slow_down=lambda key, n: key == dead or (key == flaky and n == 1)))
    keys = [*NAMES[:8], "missing.jpg"]
    out_q, free_q, _, _ = start(keys, batch=4)
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
    # One GET a key in each pass (config()): the final pass GETs exactly the two deferred keys, once each.
    assert sorted(k for k in set(log.keys) if log.count(k) > 1) == sorted([dead, flaky])
    assert log.count(dead) == log.count(flaky) == 2 and log.calls == len(keys) + 2
    assert isinstance(msgs[-1], DoneMsg)
    totals = Stats()
    for m in msgs:
        totals.add(m.stats if isinstance(m, BatchMsg | DoneMsg) else {})
    assert totals.get("s3_deferred") == 2


def test_a_fatal_fetch_error_is_reported_not_swallowed(gets):
    gets.enter_context(Gets(config(), crash_after=0))  # the credentials are gone
    out_q, free_q, _, _ = start(NAMES[:6])
    msgs = drain(out_q, free_q)
    assert isinstance(msgs[-1], ErrorMsg) and "credentials" in msgs[-1].message


@pytest.mark.parametrize("n", [1, 4, 7])
def test_every_key_settles_exactly_once(n):
    keys = [*NAMES[:n], "missing-a", "missing-b"]
    out_q, free_q, _, _ = start(keys, batch=3, concurrency=2)
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
        FailMsg(1, KeyFailure(Item(5, "b", "c", 0), "missing", "NoSuchKey", False, ("e", None))),
        DoneMsg(1, {"s3_gets": 3.0}),
        ErrorMsg(1, "loader 1: boom", "Traceback ..."),
    ):
        back = pickle.loads(pickle.dumps(msg))
        assert back == msg and type(back) is type(msg)
        if isinstance(back, FailMsg):
            assert type(back.failure.item) is Item and back.failure.uri == "s3://b/c"
