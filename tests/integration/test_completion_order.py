"""The true outcome for any order of Batch events, duplicates included, sequential or concurrent.

Each example is a complete, realistic event set of one run (array children or MNP nodes from
RUNNABLE to their end, Spot reclaims followed by attempt 2, a child failing for good, a node
crashing without result.json, an MNP job retried after a host loss, and the job-level events),
delivered in a random order with each event 1-3 times, to the real completion handler on
moto. Whatever the order, the final shard items, the counters and the single outcome event
must equal the truth computed from the scenario alone.

SLUICE_PROPERTY_EXAMPLES sets the examples per test (CI: the default; bench runs use more).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.aws.clients import Clients
from sluice.contracts.status import JobStatus, RunStatus
from sluice.control.policy import HOST_LOST_REASON
from sluice.local.emulator.events import JobChange, attempt, batch_job_state_change
from tests.integration.completion_support import Atomic, submit_run, write_result
from tests.integration.helpers import bus_events
from tests.properties import examples
from tests.threads import deliver_concurrently

EXAMPLES = examples(8)
EXITED = "Essential container in task exited"
OVER = "3 of 5 keys failed for their data (60.00% > 5.00%): corrupt 3"  # the worker's verdict, not its exit
PER_SHARD = 5
FATE = st.sampled_from(["ok", "spot_then_ok", "crash", "over_threshold"])


@dataclass
class Scenario:
    """One run's truth: each shard's fate, and the events Batch would send for it."""

    mode: str
    fates: list[str]
    mnp_host_loss: bool = False
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def failed(self) -> list[int]:
        return [i for i, f in enumerate(self.fates) if f in ("crash", "over_threshold")]

    def expected_reason(self) -> str | None:
        if not self.failed:
            return None
        why = {"crash": f"exit code 1: {EXITED}", "over_threshold": OVER}
        named = ", ".join(f"shard {i} ({why[self.fates[i]]})" for i in self.failed)
        return f"{len(self.failed)} of {len(self.fates)} shards failed: {named}"

    @property
    def processed(self) -> int:
        # Every shard but a crashed one wrote result.json; over_threshold embedded 2 of 5.
        return sum({"ok": PER_SHARD, "spot_then_ok": PER_SHARD, "crash": 0, "over_threshold": 2}[f] for f in self.fates)


def _attempts(n_done: int, reasons: list[str], codes: list[int | None], running: bool) -> list[dict[str, Any]]:
    out = [attempt(1_000 * (i + 1), 1_000 * (i + 1) + 500, codes[i], reasons[i]) for i in range(n_done)]
    if running:
        out.append(attempt(1_000 * (n_done + 1), None, None, "Task is running"))
    return out


def _task_events(job: dict[str, Any], idx: int | None, fate: str, retried: bool) -> list[dict[str, Any]]:
    """Events of one child / node / plain job, attempt by attempt."""
    mk = _maker(job, idx)
    lost = HOST_LOST_REASON.format(instance="i-0abc")
    first_lost = retried or fate == "spot_then_ok"
    evs = [mk(JobStatus.RUNNABLE, []), mk(JobStatus.STARTING, []), mk(JobStatus.RUNNING, _attempts(0, [], [], True))]
    done: list[dict[str, Any]] = []
    if first_lost:
        # Attempt 1 lost its host: back to RUNNABLE (attempt 2), then it runs again.
        done = _attempts(1, [lost], [None], False)
        evs += [
            mk(JobStatus.RUNNABLE, done, reason=lost),
            mk(JobStatus.STARTING, done),
            mk(JobStatus.RUNNING, [*done, *_attempts(0, [], [], True)]),
        ]
    n = len(done)
    if fate in ("crash", "over_threshold"):
        final = [*done, attempt(9_000, 9_500, 1, EXITED)]
        evs.append(mk(JobStatus.FAILED, final, reason=EXITED, exit_code=1))
    else:
        final = [*done, attempt(9_000, 9_500, 0, EXITED)]
        evs.append(mk(JobStatus.SUCCEEDED, final, reason=EXITED, exit_code=0))
    assert len(final) == n + 1
    return evs


def _maker(job: dict[str, Any], idx: int | None) -> Any:
    def mk(status: JobStatus, attempts: list[dict[str, Any]], reason: str | None = None, exit_code: int | None = None):
        jid = job["id"] if idx is None else f"{job['id']}{':' if job['kind'] == 'array' else '#'}{idx}"
        return batch_job_state_change(
            JobChange(
                job_id=jid,
                job_name=job["name"],
                job_queue=job["queue"],
                status=status,
                run_id=job["run_id"],
                attempts=attempts,
                status_reason=reason,
                exit_code=exit_code,
                array_index=idx if job["kind"] == "array" else None,
                node_index=idx if job["kind"] == "multinode" else None,
            )
        )

    return mk


def _job_events(job: dict[str, Any], sc: Scenario) -> list[dict[str, Any]]:
    """The submitted job's own events: PENDING, RUNNING, (a host-loss retry for MNP), its end."""
    size = {"array_size": len(sc.fates)} if job["kind"] == "array" else {"num_nodes": len(sc.fates)}

    def ev(status: JobStatus, reason: str | None = None) -> dict[str, Any]:
        return batch_job_state_change(
            JobChange(
                job_id=job["id"],
                job_name=job["name"],
                job_queue=job["queue"],
                status=status,
                run_id=job["run_id"],
                status_reason=reason,
                **size,
            )
        )

    evs = [ev(JobStatus.PENDING), ev(JobStatus.RUNNING)]
    if sc.mnp_host_loss:
        evs += [ev(JobStatus.RUNNABLE, HOST_LOST_REASON.format(instance="i-0abc")), ev(JobStatus.RUNNING)]
    end = JobStatus.FAILED if sc.failed else JobStatus.SUCCEEDED
    evs.append(ev(end, f"{len(sc.failed)} of {len(sc.fates)} failed" if sc.failed else None))
    return evs


@st.composite
def scenarios(draw: Any) -> Scenario:
    mode = draw(st.sampled_from(["array", "multinode"]))
    n = draw(st.integers(2, 4))
    fates = draw(st.lists(FATE, min_size=n, max_size=n))
    host_loss = mode == "multinode" and draw(st.booleans())
    if host_loss:  # the whole MNP job is retried: every node runs attempt 2
        fates = ["ok" if f == "spot_then_ok" else f for f in fates]
    return Scenario(mode, fates, host_loss)


def _setup(aws: Any, stack: Any, monkeypatch: Any, sc: Scenario) -> tuple[str, dict[str, Any]]:
    out = submit_run(
        aws,
        stack,
        monkeypatch,
        n_keys=len(sc.fates) * PER_SHARD,
        keys_per_shard=PER_SHARD,
        mode=sc.mode,
        nodes=len(sc.fates),
        name="order",
    )
    bus_events(aws, stack)  # drop "Run Submitted"
    run_id = out["run_id"]
    queue = stack.names["GpuJobQueue" if sc.mode == "array" else "MnpJobQueue"]
    job = {
        "id": out["job_ids"][0],
        "name": f"sluice-{run_id}-0",
        "queue": queue,
        "run_id": run_id,
        "kind": "multinode" if sc.mode == "multinode" else "array",
    }
    for i, fate in enumerate(sc.fates):
        if fate in ("ok", "spot_then_ok"):
            write_result(aws, stack, run_id, i, processed=PER_SHARD)
        elif fate == "over_threshold":
            bad = [(f"s3://images-in/img/{i:03d}-{k}.jpg", "corrupt") for k in range(3)]
            write_result(aws, stack, run_id, i, processed=2, failures=bad, max_failed_fraction=0.05)
    sc.events = [e for i, f in enumerate(sc.fates) for e in _task_events(job, i, f, sc.mnp_host_loss)]
    sc.events += _job_events(job, sc)
    return run_id, job


def _check(aws: Any, stack: Any, run_id: str, sc: Scenario) -> None:
    from sluice.control.table.ledger import Ledger
    from sluice.control.table.records import ShardRecords

    row = Ledger(aws.dynamodb, stack.names["RunsTable"]).get(run_id)
    tally = ShardRecords(aws.dynamodb, stack.names["RunsTable"])
    items = {s.shard: s for s in tally.shard_items(run_id)}
    counts = tally.counts(run_id)
    outcomes = [e for e in bus_events(aws, stack) if e["detail-type"] in ("Run Succeeded", "Run Failed")]
    assert len(outcomes) == 1, [e["detail-type"] for e in outcomes]
    (done,) = outcomes
    assert row is not None and sorted(items) == list(range(len(sc.fates)))
    assert all(s.terminal for s in items.values())
    assert sorted(i for i, s in items.items() if s.outcome == "failed") == sc.failed
    assert (counts.shards_failed, counts.shards_succeeded) == (len(sc.failed), len(sc.fates) - len(sc.failed))
    # A FAIL# mark exactly for each shard that failed for good: none left by an attempt a later one replaced.
    assert sorted(m.shard for m in tally.marks(run_id, "FAIL#")) == sc.failed
    assert done["detail"]["processed"] == sc.processed
    if sc.failed:
        assert row.status is RunStatus.FAILED and done["detail-type"] == "Run Failed"
        assert done["detail"]["shards_failed"] == sc.failed
        assert done["detail"]["reason"] == row.reason == sc.expected_reason()
    else:
        assert row.status is RunStatus.SUCCEEDED and done["detail-type"] == "Run Succeeded"


def _run_example(monkeypatch: Any, sc: Scenario, order: list[int], copies: list[int], threads: int) -> None:
    from moto import mock_aws

    from sluice.aws import clients as sluice_aws
    from sluice.local.emulator.infra import create_local
    from tests.conftest import AwsClients, local_template
    from tests.integration.completion_support import deliver_job_event

    with mock_aws(config={"batch": {"use_docker": False}}):
        sluice_aws.reset_clients()
        aws = AwsClients()
        stack = create_local(aws, template=local_template())
        run_id, _ = _setup(aws, stack, monkeypatch, sc)
        n = len(sc.events)
        seq = [sc.events[order[i % len(order)] % n] for i in range(len(order)) for _ in range(copies[i % len(copies)])]
        if threads == 1:
            for ev in seq:
                deliver_job_event(stack, ev, monkeypatch)
        else:
            _deliver_concurrently(stack, seq, threads, monkeypatch)
        _check(aws, stack, run_id, sc)


def _deliver_concurrently(stack: Any, seq: list[dict[str, Any]], threads: int, monkeypatch: Any) -> None:
    from sluice.aws import clients as sluice_aws
    from sluice.control.completion.batch_events import BatchJobStateChangeEvent
    from sluice.control.completion.state_change import handle_job_event
    from sluice.settings import Settings

    for k, v in stack.env_for("HandleJobStateChangeFunction").items():
        monkeypatch.setenv(k, v)
    settings = Settings.from_env()
    clients = Clients(dynamodb=Atomic(sluice_aws.client("dynamodb")))
    parsed = [BatchJobStateChangeEvent.model_validate(e).detail for e in seq]
    deliver_concurrently(parsed, threads, lambda d: handle_job_event(d, settings=settings, clients=clients))


_COPIES = st.lists(st.integers(1, 3), min_size=1, max_size=80)
_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@_SETTINGS
# A permutation of 0..63 taken modulo the event set's size (at most 33) delivers every event at
# least once, in a random order; `copies` repeats each delivery 1-3 times.
@given(scenarios(), st.permutations(range(64)), _COPIES)
def test_any_order_with_duplicates_gives_the_true_outcome(monkeypatch, sc, perm, copies):
    _run_example(monkeypatch, sc, perm, copies, threads=1)


@_SETTINGS
@given(scenarios(), st.permutations(range(64)), _COPIES)
def test_concurrent_delivery_gives_the_true_outcome(monkeypatch, sc, perm, copies):
    _run_example(monkeypatch, sc, perm, copies, threads=4)


def test_parent_failed_before_its_failed_childs_event_never_succeeds(monkeypatch):
    # The reported ordering: the array parent's FAILED arrives first, then every child's events.
    sc = Scenario("array", ["ok", "ok", "crash", "ok"])
    _run_example_fixed(monkeypatch, sc, parent_first=True)


def _run_example_fixed(monkeypatch: Any, sc: Scenario, *, parent_first: bool) -> None:
    from moto import mock_aws

    from sluice.aws import clients as sluice_aws
    from sluice.local.emulator.infra import create_local
    from tests.conftest import AwsClients, local_template
    from tests.integration.completion_support import deliver_job_event

    with mock_aws(config={"batch": {"use_docker": False}}):
        sluice_aws.reset_clients()
        aws = AwsClients()
        stack = create_local(aws, template=local_template())
        run_id, job = _setup(aws, stack, monkeypatch, sc)
        jobs = [e for e in sc.events if e["detail"]["jobId"] == job["id"]]
        rest = [e for e in sc.events if e["detail"]["jobId"] != job["id"]]
        order = jobs + rest if parent_first else rest + jobs
        outs = [deliver_job_event(stack, ev, monkeypatch)["status"] for ev in order]
        _check(aws, stack, run_id, sc)
    # Decided once, by the last event that settled the last shard, not by the parent's event.
    assert outs.count("finalized") == 1 and outs[-1] == "finalized"
