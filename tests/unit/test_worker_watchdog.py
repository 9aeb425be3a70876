"""gpu_worker.watchdog: a rank whose count stops is ended with STALLED; a slow but moving one is not."""

from __future__ import annotations

import threading
import time
from typing import Any

from gpu_worker.errors import STALLED
from gpu_worker.watchdog import Beats, BeatTarget, Loading, Watchdog, beat_key, stall_after_s
from sluice.control.policy import STALLED_EXIT
from tests import pace

TARGET = BeatTarget("beats", "run-1", "job:3", shard=3, attempt=2, rank=0)


class Table:
    """Stands in for DynamoDB's PutItem (what the worker role may call), keeping the items."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []

    def put_item(self, **kw: Any) -> None:
        self.items.append(kw["Item"])


class Exits:
    def __init__(self) -> None:
        self.codes: list[int] = []
        self.fired = threading.Event()

    def __call__(self, code: int) -> None:
        self.codes.append(code)
        self.fired.set()


def test_worker_and_retry_strategy_agree_on_the_stalled_exit_code() -> None:
    assert STALLED == STALLED_EXIT


def test_a_hung_pipeline_thread_is_ended_with_the_stalled_code() -> None:
    """The pipeline thread sleeps holding no progress; the watchdog thread ends the attempt on its own."""
    processed = [5]
    hung = threading.Thread(target=time.sleep, args=(30,), daemon=True)  # a deadlocked loader, a hung collective
    hung.start()
    table, exits = Table(), Exits()
    t0 = time.monotonic()
    dog = Watchdog(lambda: processed[0], 0.4, Beats(TARGET, 0.4, table), interval_s=0.05, exit_fn=exits).start()
    assert exits.fired.wait(pace.scaled(5))
    took = time.monotonic() - t0
    dog.stop()
    assert exits.codes == [STALLED]
    assert 0.4 <= took < pace.scaled(2.0), took  # at its limit: not before, nor long after (room on a busy machine)
    assert hung.is_alive()  # it did not need the stuck thread
    # One beat at the start (processed 5), none after: a count that does not move writes nothing.
    assert [int(i["processed"]["N"]) for i in table.items] == [5]
    item = table.items[0]
    assert item["pk"] == {"S": "run-1"} and item["sk"] == {"S": beat_key(3, 2, 0)} == {"S": "000003#002#000"}
    assert item["job_id"] == {"S": "job:3"} and float(item["stall_after_s"]["N"]) == 0.4


def test_slow_but_moving_is_never_ended() -> None:
    processed = [0]
    table, exits = Table(), Exits()
    stall, step = pace.scaled(0.5), pace.scaled(0.1)  # a busy machine oversleeps: the ratio is what counts
    dog = Watchdog(lambda: processed[0], stall, Beats(TARGET, stall, table), interval_s=0.05, exit_fn=exits).start()
    for _ in range(12):  # more than twice stall_after_s in all, one key every fifth of it
        time.sleep(step)
        processed[0] += 1
    dog.stop()
    assert exits.codes == []
    counts = [int(i["processed"]["N"]) for i in table.items]
    assert counts == sorted(counts) and counts[-1] >= 10  # beats follow the count


def test_no_table_no_beats_and_the_watchdog_still_ends_a_stall() -> None:
    exits = Exits()
    dog = Watchdog(lambda: 0, 0.2, Beats(BeatTarget("", "r", "j", 0, 1, 0), 0.2), interval_s=0.05, exit_fn=exits)
    dog.start()
    assert exits.fired.wait(pace.scaled(5))
    dog.stop()
    assert exits.codes == [STALLED]


def test_a_failing_beat_write_does_not_stop_the_watchdog() -> None:
    class Broken:
        def put_item(self, **kw: Any) -> None:
            raise RuntimeError("throttled")

    exits = Exits()
    Watchdog(lambda: 1, 0.2, Beats(TARGET, 0.2, Broken()), interval_s=0.05, exit_fn=exits).start()
    assert exits.fired.wait(pace.scaled(5))


def test_stall_after_s_setting_wins_over_the_plan() -> None:
    assert stall_after_s(600, {}) == 600
    assert stall_after_s(600, {"SLUICE_STALL_AFTER_S": "10"}) == 10
    assert stall_after_s(None, {}) == 1800  # a plan from before stall_after_s


def test_loading_models_gets_the_load_grace_and_readiness_counts_as_progress() -> None:
    """A rank still loading its models may stay still for stall_after_s + the plan's load grace; then stall_after_s."""
    stall, grace = pace.scaled(0.3), pace.scaled(0.9)  # a busy machine oversleeps: the ratios are what count
    loading = [True]
    table, exits = Table(), Exits()
    beats = Beats(TARGET, stall, table)
    still = lambda: loading[0]  # noqa: E731
    dog = Watchdog(lambda: 0, stall, beats, interval_s=0.05, exit_fn=exits, loading=Loading(still, grace))
    assert dog.limit_s(True) == stall + grace and dog.limit_s(False) == stall
    dog.start()
    time.sleep(2 * stall)  # twice stall_after_s, but loading
    assert exits.codes == []
    loading[0] = False  # the models are ready: that moved, and from now on the plain limit applies
    assert exits.fired.wait(pace.scaled(5))
    dog.stop()
    limits = [float(i["stall_after_s"]["N"]) for i in table.items]
    assert limits == [float(f"{stall + grace:g}"), float(f"{stall:g}")]  # as the beat item writes them


def test_a_rank_still_loading_past_its_load_grace_is_ended() -> None:
    """The load grace is bounded: a model load that never ends is a stall too."""
    table, exits = Table(), Exits()
    beats = Beats(TARGET, 0.2, table)
    never_ready = lambda: True  # noqa: E731  the models never get ready
    dog = Watchdog(lambda: 0, 0.2, beats, interval_s=0.05, exit_fn=exits, loading=Loading(never_ready, 0.3))
    t0 = time.monotonic()
    dog.start()
    assert exits.fired.wait(pace.scaled(5))
    dog.stop()
    assert exits.codes == [STALLED] and time.monotonic() - t0 >= 0.5
