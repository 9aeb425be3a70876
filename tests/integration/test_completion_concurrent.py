"""Concurrent delivery gives the ledger and outcome of Batch's own order, whatever the interleaving.

Four realistic runs (a 7-shard array run and a 3-node MNP run, each with and without a shard
failing for good, with Spot-retried attempts) have their complete event sets delivered, each
event 1-3 times in a random order, from 4 threads into the real completion handler on moto.
DynamoDB is made atomic per request (moto does not serialise conditional writes) and, as
DynamoDB does, a TransactWriteItems that touches an item another transaction holds is
cancelled with TransactionConflict (our code retries it). The RUN item, the counters, the
marks and the outcome must equal those of one sequential delivery in Batch's order, and no
"Run Progress" may count more shards done or failed than the run has.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.aws.clients import Clients
from sluice.control.completion.batch_events import BatchJobStateChangeEvent
from sluice.control.completion.state_change import handle_job_event
from sluice.control.table.ledger import Ledger
from sluice.control.table.records import ShardRecords
from sluice.errors import RetriableError
from sluice.settings import Settings
from tests.integration.concurrent_support import Contended
from tests.integration.helpers import bus_events
from tests.integration.test_completion_order import Scenario, _setup
from tests.properties import examples
from tests.threads import deliver_concurrently

EXAMPLES = examples(3)
THREADS = 4
LAMBDA_TRIES = 10  # a handler error is retried by Lambda (2 retries) and EventBridge (8): the event is redelivered
SHAPES = {
    "array": Scenario("array", ["ok", "spot_then_ok", "ok", "ok", "spot_then_ok", "ok", "ok"]),
    "array-failed": Scenario("array", ["ok", "spot_then_ok", "ok", "over_threshold", "spot_then_ok", "ok", "ok"]),
    "mnp": Scenario("multinode", ["ok", "ok", "ok"], mnp_host_loss=True),
    "mnp-failed": Scenario("multinode", ["ok", "ok", "crash"], mnp_host_loss=True),
}
_REFERENCE: dict[str, dict[str, Any]] = {}  # shape -> what Batch's own order gives (computed once)


def _ledger_view(aws: Any, stack: Any, run_id: str) -> dict[str, Any]:
    """Everything the run's figures are made of: RUN item, counters, marks, shard states, jobs."""
    table = stack.names["RunsTable"]
    run = Ledger(aws.dynamodb, table).get(run_id)
    assert run is not None
    tally = ShardRecords(aws.dynamodb, table)
    shards = {
        s.shard: (s.status, s.seq, s.outcome, s.why, s.processed, s.failed_keys, s.failed_transient)
        for s in tally.shard_items(run_id)
    }
    return {
        "run": (run.status, run.processed, run.failed_keys, run.reason, run.shards_failed_list, run.jobs_done),
        "jobs_failed": run.jobs_failed,
        "counts": tally.counts(run_id).model_dump(),
        "fail_marks": sorted((m.shard, m.why) for m in tally.marks(run_id, "FAIL#")),
        "retry_marks": sorted(m.shard for m in tally.marks(run_id, "RETRY#")),
        "shards": shards,
    }


def _outcome(events: list[dict[str, Any]], run_id: str) -> tuple[str, str]:
    """The one outcome event, its run id and duration left out (they differ between runs)."""
    done = [e for e in events if e["detail-type"] in ("Run Succeeded", "Run Failed")]
    assert len(done) == 1, [e["detail-type"] for e in done]
    detail = {k: v for k, v in done[0]["detail"].items() if k != "duration_s"}
    return done[0]["detail-type"], json.dumps(detail, sort_keys=True).replace(run_id, "RUN")


def _deliver(stack: Any, seq: list[dict[str, Any]], threads: int, monkeypatch: Any, db: Any) -> None:
    for k, v in stack.env_for("HandleJobStateChangeFunction").items():
        monkeypatch.setenv(k, v)
    cfg = Settings.from_env()
    clients = Clients(dynamodb=db)
    parsed = [BatchJobStateChangeEvent.model_validate(e).detail for e in seq]
    deliver_concurrently(
        parsed, threads, lambda d: _with_retries(lambda: handle_job_event(d, settings=cfg, clients=clients))
    )


def _with_retries(deliver: Any) -> None:
    """One event delivered, and delivered again while its handler raises RetriableError, as Lambda does."""
    for attempt in range(LAMBDA_TRIES):
        try:
            deliver()
            return
        except RetriableError:
            if attempt == LAMBDA_TRIES - 1:
                raise
            time.sleep(0.01 * (attempt + 1))  # Lambda retries after a delay, not at once


def _run(monkeypatch: Any, shape: str, order: list[int] | None, copies: list[int]) -> dict[str, Any]:
    """Deliver the shape's events (Batch's order once when `order` is None); what the run came to."""
    from moto import mock_aws

    from sluice.aws import clients as sluice_aws
    from sluice.local.emulator.infra import create_local
    from tests.conftest import AwsClients, local_template

    sc = Scenario(SHAPES[shape].mode, list(SHAPES[shape].fates), SHAPES[shape].mnp_host_loss)
    with mock_aws(config={"batch": {"use_docker": False}}):
        sluice_aws.reset_clients()
        aws = AwsClients()
        stack = create_local(aws, template=local_template())
        run_id, _ = _setup(aws, stack, monkeypatch, sc)
        n = len(sc.events)
        if order is None:
            seq, threads, db = sc.events, 1, sluice_aws.client("dynamodb")
        else:
            seq = [sc.events[order[i] % n] for i in range(len(order)) for _ in range(copies[i % len(copies)])]
            threads, db = THREADS, Contended(sluice_aws.client("dynamodb"))
        _deliver(stack, seq, threads, monkeypatch, db)
        events = bus_events(aws, stack)
        view = _ledger_view(aws, stack, run_id)
    return {"view": view, "outcome": _outcome(events, run_id), "progress": _progress(events), "sc": sc, "db": db}


def _progress(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["detail"] for e in events if e["detail-type"] == "Run Progress"]


def _reference(monkeypatch: Any, shape: str) -> dict[str, Any]:
    if shape not in _REFERENCE:
        _REFERENCE[shape] = _run(monkeypatch, shape, None, [1])
    return _REFERENCE[shape]


_SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("shape", sorted(SHAPES))
@_SETTINGS
# A permutation of 0..63 taken modulo the event set's size (at most 40) delivers every event
# at least once, in a random order; `copies` repeats each delivery 1-3 times.
@given(perm=st.permutations(range(64)), copies=st.lists(st.integers(1, 3), min_size=1, max_size=64))
def test_concurrent_delivery_gives_batchs_own_ledger(monkeypatch, shape, perm, copies):
    ref = _reference(monkeypatch, shape)
    got = _run(monkeypatch, shape, perm, copies)
    sc: Scenario = got["sc"]
    assert got["view"] == ref["view"]
    assert got["outcome"] == ref["outcome"]
    assert json.loads(ref["outcome"][1])["processed"] == sc.processed
    failed_for_good = len(sc.failed)
    for p in got["progress"]:
        assert p["shards_total"] == len(sc.fates), p
        assert p["shards_done"] <= len(sc.fates) and p["shards_failed"] <= failed_for_good, p


def test_contention_raises_transaction_conflicts_and_they_are_retried(monkeypatch):
    # The injection is real: under 4 threads a run's transactions do conflict, and the ledger is still exact.
    ref = _reference(monkeypatch, "array")
    got = _run(monkeypatch, "array", list(range(64)), [3])
    assert got["db"].conflicts > 0
    assert got["view"] == ref["view"] and got["outcome"] == ref["outcome"]


def test_a_write_to_an_item_in_a_transaction_is_retried_in_the_process(aws, stack, monkeypatch):
    # DynamoDB rejects an UpdateItem on an item another transaction holds (TransactionConflictException,
    # nothing written; botocore does not retry it): the decision is written on a later try, not dropped.
    from sluice.contracts.status import RunStatus
    from sluice.control.table import ddb

    monkeypatch.setattr(ddb.time, "sleep", lambda s: None)
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    assert ledger.claim("r7", "s3://b/manifests/z.json")
    left = {"n": 3}

    def conflict(**_: object) -> None:
        if left["n"] > 0:
            left["n"] -= 1
            raise ClientError(
                {
                    "Error": {"Code": "TransactionConflictException", "Message": "Transaction is ongoing"},
                    "ResponseMetadata": {"HTTPStatusCode": 400},
                },
                "UpdateItem",
            )

    aws.dynamodb.meta.events.register("before-call.dynamodb.UpdateItem", conflict, unique_id="conflict-r7")
    ddb.STATS.clear()
    ledger.mark_running("r7")  # PLANNING: its condition fails quietly, after the conflicts
    assert ddb.STATS["writes_retried"] == 3 and ledger.get("r7").status is RunStatus.PLANNING
    left["n"] = ddb.TRANSACT_TRIES
    with pytest.raises(RetriableError, match="TransactionConflictException"):
        ledger.release("r7", "boom")
    assert ledger.get("r7").status is RunStatus.PLANNING  # nothing half-applied
    aws.dynamodb.meta.events.unregister("before-call.dynamodb.UpdateItem", unique_id="conflict-r7")
