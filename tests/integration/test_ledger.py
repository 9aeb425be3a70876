"""The ledger on moto: typed items, and one classification of DynamoDB errors."""

from __future__ import annotations

import pytest

from sluice.aws.errors import AwsFatalError
from sluice.contracts.events import RunProgress
from sluice.contracts.status import JobStatus, RunStatus
from sluice.control.table.items import RunItem
from sluice.control.table.ledger import Ledger
from sluice.control.table.records import ShardRecords


def test_items_are_typed_views_of_what_is_stored(aws, stack):
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    assert ledger.claim("r1", "s3://b/manifests/x.json", now=1_000)
    row = ledger.get("r1")
    assert isinstance(row, RunItem) and row.status is RunStatus.PLANNING and row.created_at == 1_000
    assert row.total_shards == 0 and row.jobs is None
    tally = ShardRecords(aws.dynamodb, stack.names["RunsTable"])
    assert tally.record_shard("r1", 3, {"status": JobStatus.RUNNING, "attempt": 1, "job_id": "j:3"}, seq=14)
    (item,) = tally.shard_items("r1")
    assert (item.shard, item.status, item.seq, item.job_id) == (3, JobStatus.RUNNING, 14, "j:3")
    assert [r.run_id for r in ledger.recent_runs()] == ["r1"]


def test_a_field_outside_the_run_item_contract_is_refused(aws, stack):
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    assert ledger.claim("r2", "s3://b/manifests/y.json")
    with pytest.raises(ValueError, match="not fields of the RUN item: \\['totl_keys'\\]"):
        ledger.mark_submitted(
            "r2", {"totl_keys": 3}, RunProgress(run_id="r2", shards_done=0, shards_failed=0, shards_total=1)
        )
    assert ledger.get("r2").status is RunStatus.PLANNING


def test_the_outbox_claim_returns_the_event_the_item_holds_and_is_held_once(aws, stack):
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    assert ledger.claim("r3", "s3://b/manifests/z.json")
    assert ledger.claim_outbox("r3", now=1_000) is None  # nothing pending
    first = RunProgress(run_id="r3", shards_done=0, shards_failed=0, shards_total=2)
    ledger.mark_submitted("r3", {"shards": 2}, first)
    held = ledger.claim_outbox("r3", now=1_000)
    assert held is not None and held.detail_type == "Run Progress" and held.detail == first.model_dump_json()
    assert ledger.claim_outbox("r3", now=1_030) is None  # held for 60 s by the first claimant
    ledger.release_outbox("r3", "Run Progress")
    again = ledger.claim_outbox("r3", now=1_031)
    assert again is not None and again.detail == first.model_dump_json()
    ledger.clear_outbox("r3", "Run Progress")
    assert ledger.get("r3").outbox is None and ledger.claim_outbox("r3", now=2_000) is None


def test_a_missing_table_is_fatal_with_advice_not_retried(aws, stack):
    ledger = Ledger(aws.dynamodb, "no-such-table")
    with pytest.raises(AwsFatalError, match=r"ResourceNotFoundException.*check that it exists"):
        ledger.get("r1")
    with pytest.raises(AwsFatalError, match="no-such-table"):
        ledger.claim("r1", "s3://b/manifests/x.json")


def _conflicts(client, times: int):
    """DynamoDB cancelling the next `times` TransactWriteItems for a TransactionConflict."""
    from botocore.exceptions import ClientError

    left = {"n": times}

    def cancel(**_: object) -> None:
        if left["n"] > 0:
            left["n"] -= 1
            raise ClientError(
                {
                    "Error": {"Code": "TransactionCanceledException", "Message": "conflict"},
                    "CancellationReasons": [{"Code": "TransactionConflict"}, {"Code": "None"}],
                    "ResponseMetadata": {"HTTPStatusCode": 400},
                },
                "TransactWriteItems",
            )

    client.meta.events.register("before-call.dynamodb.TransactWriteItems", cancel, unique_id=f"conflict-{id(left)}")


def test_transaction_conflicts_are_retried_in_the_process_then_given_back(aws, stack, monkeypatch):
    from sluice.control.table import ddb
    from sluice.errors import RetriableError

    monkeypatch.setattr(ddb.time, "sleep", lambda s: None)
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    assert ledger.claim("r9", "s3://b/manifests/z.json")
    tally = ShardRecords(aws.dynamodb, stack.names["RunsTable"])
    ddb.STATS.clear()
    _conflicts(aws.dynamodb, 3)
    assert tally.record_job_terminal("r9", "job-a", JobStatus.SUCCEEDED, None)  # won on the 4th try
    assert ddb.STATS["transactions_retried"] == 3 and ledger.get("r9").jobs_done == 1
    _conflicts(aws.dynamodb, ddb.TRANSACT_TRIES)
    with pytest.raises(RetriableError, match=r"TransactionConflict.*will retry"):
        tally.record_job_terminal("r9", "job-b", JobStatus.SUCCEEDED, None)
    assert ledger.get("r9").jobs_done == 1  # nothing half-applied
