"""The tail's split, on moto: every key of a split shard embedded and committed exactly once, in any order.

A real run is submitted; its shard 0 (20 keys, one rank) is worked by a simulated rank that
starts keys through the real fence (gpu_worker.fence.RankFence, reserving 3 ahead) and
commits each after it, while the real sweep code splits it (sluice.control.sweep.tail: the
transaction `commit`, then `apply` or, after a crash between them, `resume`) at points drawn
from the fence's stored reservation, stale or not. Hypothesis draws the interleaving: rank
steps, rank crashes (between starting a key and committing it: the next attempt resumes from
the committed keys with a new fence on the same slice), splits (each delivered once or twice),
sweep crashes between the transaction and the child's submission, and the child's work. The
DynamoDB client is moto made atomic per request with DynamoDB's transaction conflicts
(tests/integration/concurrent_support.py); one test delivers the split on another thread
while the rank runs.

Whatever the order: the slow rank's committed keys and the child's (read from the shard file
the sweep wrote) are the shard's keys, each exactly once; a split either happened whole (the
fence's split point, a SPLIT# item, one more pass, one child job) or not at all.
"""

from __future__ import annotations

import io
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_worker.fence import RankFence, SliceSpec
from gpu_worker.watchdog import BeatTarget
from sluice.aws.clients import Clients
from sluice.aws.ranged import RangedObject
from sluice.aws.store import ObjectStore
from sluice.contracts.plan import load_plan
from sluice.contracts.tail import Fence, fence_key
from sluice.control.context import Context
from sluice.control.sweep.stragglers import Split
from sluice.control.sweep.tail import apply, commit, resume, splits, sweep_tail
from sluice.control.table.ddb import values
from sluice.ops.status import render, run_status
from sluice.settings import Settings
from sluice.shards import ShardReader
from tests.integration.concurrent_support import Contended
from tests.integration.helpers import bus_events
from tests.properties import examples

N = 20  # keys of shard 0
AHEAD = 3

STEP = st.one_of(
    st.tuples(st.just("work"), st.integers(1, 4)),  # the rank starts and commits this many keys
    st.tuples(st.just("crash"), st.just(0)),  # the rank starts a key and dies before committing it
    st.tuples(st.just("split"), st.integers(-4, 4)),  # the sweep splits at the stored reservation + this
    st.tuples(st.just("split_twice"), st.integers(-2, 6)),  # the same split delivered twice
    st.tuples(st.just("split_crash"), st.integers(0, 6)),  # the sweep dies after the transaction
    st.tuples(st.just("resume"), st.just(0)),  # a later sweep finishes recorded splits
)


@dataclass
class Sim:
    """The run, the slow rank's attempts and what each side committed."""

    ctx: Context
    run_id: str
    keys: list[str]  # shard 0's keys, by position
    beats_table: str
    attempt: int = 1
    committed: set[int] = field(default_factory=set)  # positions the slow shard committed
    stopped_at: int | None = None  # where the rank learned its slice was split
    fence: RankFence | None = None

    def new_attempt(self) -> None:
        claimed = max(self.committed, default=-1) + 1
        target = BeatTarget(self.beats_table, self.run_id, f"job:0#{self.attempt}", 0, self.attempt, 0)
        self.fence = RankFence(target, SliceSpec(0, N, claimed, AHEAD), client=self.ctx.clients.dynamodb)

    def next_pos(self) -> int | None:
        return next((p for p in range(N) if p not in self.committed), None)

    def work(self, n: int, crash: bool = False) -> None:
        for _ in range(n):
            pos = self.next_pos()
            if pos is None or self.stopped_at is not None:
                return
            assert self.fence is not None
            if not self.fence.admit(pos):
                self.stopped_at = self.fence.split_at
                return
            if crash:  # started, never committed: the attempt dies
                self.attempt += 1
                self.new_attempt()
                return
            self.committed.add(pos)

    def stored(self) -> Fence | None:
        got = self.ctx.clients.dynamodb.get_item(
            TableName=self.beats_table, Key={"pk": {"S": self.run_id}, "sk": {"S": fence_key(0, 0, N)}}
        )
        return Fence.of(values(got["Item"])) if "Item" in got else None

    def split(self, delta: int) -> dict[str, Any] | None:
        """Decide from the stored fence (as the sweep reads it) and commit; the SPLIT# record when it held."""
        f = self.stored()
        run = self.ctx.ledger.get(self.run_id)
        assert run is not None
        if f is None or not 0 < f.reserved_to + delta < N:
            return None
        at = f.reserved_to + delta
        s = Split(0, 0, N, at, run.total_shards, f.attempt, 0, 100.0, 10.0, 20.0)
        if not commit(self.ctx, run, s):
            return None
        return {"shard": 0, "to_shard": s.to, "at": at, "hi": N, "lo": 0}


def _setup(aws: Any, stack: Any, monkeypatch: Any) -> Sim:
    from tests.integration.completion_support import submit_run

    out = submit_run(aws, stack, monkeypatch, n_keys=2 * N, keys_per_shard=N, name="tail")
    for k, v in stack.env_for("HandleJobStateChangeFunction").items():
        monkeypatch.setenv(k, v)
    clients = Clients(s3=aws.s3, dynamodb=Contended(aws.dynamodb), batch=aws.batch, events=aws.events)
    ctx = Context.build(Settings.from_env(), clients)
    run = ctx.ledger.get(out["run_id"])
    assert run is not None and run.plan_uri
    store = ObjectStore(aws.s3)
    plan = load_plan(store.get, run.plan_uri)
    keys = [f"s3://{b}/{k}" for b, ks in ShardReader(RangedObject(store, plan.shard_uri(0))).groups() for k in ks]
    assert len(keys) == N
    sim = Sim(ctx, out["run_id"], keys, stack.names["BeatsTable"])
    sim.new_attempt()
    return sim


def _child_keys(sim: Sim, to_shard: int) -> list[str]:
    store = ObjectStore(sim.ctx.clients.s3)
    run = sim.ctx.ledger.get(sim.run_id)
    assert run is not None and run.plan_uri
    plan = load_plan(store.get, run.plan_uri)
    reader = ShardReader(RangedObject(store, plan.shard_uri(to_shard)))
    return [f"s3://{b}/{k}" for b, ks in reader.groups() for k in ks]


def _check(sim: Sim) -> None:
    """Drive the rank to its end, finish recorded splits, then every key exactly once."""
    run = sim.ctx.ledger.get(sim.run_id)
    assert run is not None
    resume(sim.ctx, run, splits(sim.ctx, sim.run_id))
    sim.work(N)
    recs = splits(sim.ctx, sim.run_id)
    run = sim.ctx.ledger.get(sim.run_id)
    assert run is not None
    split_passes = [p for p in run.passes if p.split_of is not None]
    mine = [sim.keys[p] for p in sorted(sim.committed)]
    stored = sim.stored()
    if not recs:  # no split held: the rank did every key, nothing else was made
        assert sim.stopped_at is None and not split_passes
        assert stored is None or stored.split_at is None
        assert mine == sim.keys
        return
    (rec,) = recs  # one slice, split at most once
    assert rec["state"] == "submitted" and rec["job_id"]
    assert stored is not None and stored.split_at == int(rec["at"]) and sim.stopped_at == int(rec["at"])
    assert [(p.first_shard, p.split_of) for p in split_passes] == [(int(rec["to_shard"]), 0)]
    assert [j.id for j in run.jobs or []].count(rec["job_id"]) == 1
    child = _child_keys(sim, int(rec["to_shard"]))
    assert sorted(mine + child) == sorted(sim.keys)  # every key once: none twice, none missing
    assert child == sim.keys[int(rec["at"]) :]


def _play(sim: Sim, steps: list[tuple[str, int]]) -> None:
    for op, arg in steps:
        if op == "work":
            sim.work(arg)
        elif op == "crash":
            sim.work(1, crash=True)
        elif op in ("split", "split_twice"):
            for _ in range(2 if op == "split_twice" else 1):
                rec = sim.split(arg)
                if rec is not None:
                    run = sim.ctx.ledger.get(sim.run_id)
                    assert run is not None
                    apply(sim.ctx, run, rec)
        elif op == "split_crash":
            sim.split(arg)  # recorded; the child is made by the next sweep's resume (or _check's)
        else:
            run = sim.ctx.ledger.get(sim.run_id)
            assert run is not None
            resume(sim.ctx, run, splits(sim.ctx, sim.run_id))


@settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEP, min_size=1, max_size=12))
def test_a_split_shard_commits_every_key_exactly_once(aws, stack, monkeypatch, steps):
    sim = _setup(aws, stack, monkeypatch)
    _play(sim, steps)
    _check(sim)


def test_a_split_that_loses_the_race_with_the_rank_is_refused_whole(aws, stack, monkeypatch):
    sim = _setup(aws, stack, monkeypatch)
    sim.work(2)  # reserved to 0 + 3 at the first key, then 4 + ... : the stored reservation is ahead
    f = sim.stored()
    assert f is not None and f.reserved_to > 2
    run = sim.ctx.ledger.get(sim.run_id)
    assert run is not None
    stale = Split(0, 0, N, 2, run.total_shards, f.attempt, 0, 100.0, 10.0, 20.0)  # behind the reservation
    assert not commit(sim.ctx, run, stale)
    after = sim.ctx.ledger.get(sim.run_id)
    assert after is not None and after.passes == run.passes and not splits(sim.ctx, sim.run_id)
    f2 = sim.stored()
    assert f2 is not None and f2.split_at is None  # nothing of it was written
    _check(sim)


def test_a_split_delivered_while_the_rank_runs_is_exact(aws, stack, monkeypatch):
    """The sweep's transaction on another thread, racing the rank's reservations (each request atomic)."""
    sim = _setup(aws, stack, monkeypatch)
    sim.work(1)
    got: list[dict[str, Any] | None] = []
    t = threading.Thread(target=lambda: got.append(sim.split(AHEAD)))
    t.start()
    sim.work(N)
    t.join()
    if got and got[0] is not None:
        run = sim.ctx.ledger.get(sim.run_id)
        assert run is not None
        apply(sim.ctx, run, got[0])
    _check(sim)


def _beat(aws: Any, stack: Any, run_id: str, shard: int, done: int, ages: tuple[float, float, float]) -> None:
    """A rank's beat as gpu_worker.watchdog writes it: started, ready and last moved `ages` seconds ago."""
    from gpu_worker.watchdog import Beats

    now = time.time()
    target = BeatTarget(stack.names["BeatsTable"], run_id, f"job:{shard}", shard, 1, shard)
    beats = Beats(target, 60, aws.dynamodb, todo=N)
    beats.started_at, beats.ready_at = now - ages[0], now - ages[1]
    beats.write(done, now - ages[2])


def test_the_sweep_splits_a_slow_rank_and_status_names_it(aws, stack, monkeypatch):
    """Three shards started; two ended in ~4 s, one is expected to take minutes: its remaining keys go to a child."""
    from tests.integration.completion_support import submit_run

    out = submit_run(aws, stack, monkeypatch, n_keys=3 * N, keys_per_shard=N, name="slow")
    run_id = out["run_id"]
    for k, v in stack.env_for("HandleJobStateChangeFunction").items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("SLUICE_SPLIT_STARTUP_S", "0")
    monkeypatch.setenv("SLUICE_SPLIT_MIN_KEYS", "2")
    clients = Clients(s3=aws.s3, dynamodb=aws.dynamodb, batch=aws.batch, events=aws.events)
    ctx = Context.build(Settings.from_env(), clients)
    _beat(aws, stack, run_id, 1, N, (12, 10, 8))  # 20 keys in 2 s after a 2 s load: 4 s
    _beat(aws, stack, run_id, 2, N, (12, 10, 8))
    _beat(aws, stack, run_id, 0, 4, (30, 28, 1))  # 4 keys in 27 s: ~137 s to go
    target = BeatTarget(stack.names["BeatsTable"], run_id, "job:0", 0, 1, 0)
    fence = RankFence(target, SliceSpec(0, N, 0, AHEAD), client=aws.dynamodb)
    assert fence.admit(4)  # its reservation: 7
    run = ctx.ledger.get(run_id)
    assert run is not None

    actions = sweep_tail(ctx, run, now=time.time())

    (rec,) = splits(ctx, run_id)
    assert actions == [f"split: shard 0 at {rec['at']}: {N - int(rec['at'])} keys to shard 3"]
    assert 7 <= int(rec["at"]) <= N - 2 and rec["state"] == "submitted"
    after = ctx.ledger.get(run_id)
    assert after is not None and after.total_shards == 4
    assert [(j.shard_offset, j.kind) for j in after.jobs or []][-1] == (3, "single")
    sim = Sim(ctx, run_id, [], stack.names["BeatsTable"])
    assert len(_child_keys(sim, 3)) == N - int(rec["at"])
    assert sweep_tail(ctx, after, now=time.time()) == []  # the slice is split once
    progress = [e["detail"] for e in bus_events(aws, stack) if e["detail-type"] == "Run Progress"]
    assert [s["to_shard"] for p in progress for s in p.get("split") or []] == [3]

    text = io.StringIO()
    render(run_status(ctx.ledger, run_id, stack.names["BeatsTable"]), text)
    shown = text.getvalue()
    assert f"split     shard 0 at {rec['at']}: {N - int(rec['at'])} keys to shard 3" in shown
    assert "slowest   shard 0 rank 0: 4/20 keys at 0.15/s" in shown


SPLIT_EVENTS = 7  # shard 0 running + succeeded, shard 1 running + succeeded, the array's end, the split job's two


@settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.permutations(range(SPLIT_EVENTS)), copies=st.lists(st.integers(1, 2), min_size=7, max_size=7))
def test_a_split_runs_outcome_is_true_for_any_order_of_its_events(aws, stack, monkeypatch, order, copies):
    """The slow shard's, the other shard's and the split child's Batch events, in any order, each 1-2 times."""
    from tests.integration.completion_support import deliver_job_event, job_event, write_result

    sim = _setup(aws, stack, monkeypatch)
    sim.work(2)
    rec = sim.split(AHEAD)
    assert rec is not None
    run = sim.ctx.ledger.get(sim.run_id)
    assert run is not None and run.jobs
    split_job = apply(sim.ctx, run, rec)
    sim.work(N)
    at = int(rec["at"])
    write_result(aws, stack, sim.run_id, 0, processed=at)  # the slow shard settles its own keys
    write_result(aws, stack, sim.run_id, 1, processed=N)
    write_result(aws, stack, sim.run_id, 2, processed=N - at)  # the child settles the rest
    queue, array = stack.names["GpuJobQueue"], run.jobs[0].id

    def child(sample: str, i: int) -> dict[str, Any]:
        return job_event(sample, run_id=sim.run_id, job_id=array, queue=queue, child=i)

    def single(sample: str) -> dict[str, Any]:
        ev = job_event(sample, run_id=sim.run_id, job_id=split_job, queue=queue)
        ev["detail"].pop("arrayProperties", None)
        return ev

    events = [
        child("batch-array-child-running", 0),
        child("batch-array-child-succeeded", 0),
        child("batch-array-child-running", 1),
        child("batch-array-child-succeeded", 1),
        job_event("batch-array-parent-succeeded", run_id=sim.run_id, job_id=array, queue=queue),
        single("batch-array-child-running"),
        single("batch-array-child-succeeded"),
    ]
    for i in order:
        for _ in range(copies[i]):
            deliver_job_event(stack, events[i], monkeypatch)
    outcome = [e["detail"] for e in bus_events(aws, stack) if e["detail-type"] in ("Run Succeeded", "Run Failed")]
    assert len(outcome) == 1, outcome
    (o,) = outcome
    assert (o["processed"], o["failed"], o["splits"], o["split_keys"]) == (2 * N, 0, 1, N - at)
    progress = [e["detail"] for e in bus_events(aws, stack) if e["detail-type"] == "Run Progress"]
    assert all(p["shards_done"] <= p["shards_total"] for p in progress)
