"""The run's counters are read as one snapshot, never a sum that existed at no moment.

Three states exist in turn: S0 (shard 1 failed, shard 2 running), S1 (shard 1's retry
succeeded), S2 (then shard 2 failed). A BatchGetItem read item by item, as DynamoDB documents it
(read-committed), that reads shard 1's counter before S1 and shard 2's after S2 sums to two
failed shards: a state the run never had, which "Run Progress" would publish. The counters
are read with TransactGetItems (serializable) instead.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from sluice.contracts.status import JobStatus
from sluice.control.completion.verdict import Settlement
from sluice.control.table import ddb
from sluice.control.table.ddb import item, values
from sluice.control.table.items import ShardOutcome
from sluice.control.table.records import COUNTER_SHARDS, ShardRecords, counter_sk
from sluice.errors import RetriableError
from tests.integration.concurrent_support import Contended

RUN = "r-snapshot"


def _failed(records: ShardRecords, shard: int, seq: int) -> None:
    state = {"status": JobStatus.FAILED, "attempt": 1, "job_id": f"j{shard}-{seq}"}
    records.record_shard(RUN, shard, state, seq=seq, settlement=Settlement(ShardOutcome.FAILED, "exit code 1"))


def _succeeded(records: ShardRecords, shard: int, seq: int) -> None:
    state = {"status": JobStatus.SUCCEEDED, "attempt": 2, "job_id": f"j{shard}-{seq}"}
    records.record_shard(RUN, shard, state, seq=seq, settlement=Settlement(ShardOutcome.SUCCEEDED, None, processed=10))


def _s0(records: ShardRecords) -> None:
    _failed(records, 1, seq=1)
    state = {"status": JobStatus.RUNNING, "attempt": 1, "job_id": "j2-1"}
    records.record_shard(RUN, 2, state, seq=1)


def _s1_then_s2(records: ShardRecords) -> None:
    _succeeded(records, 1, seq=2)
    _failed(records, 2, seq=2)


# (shards succeeded, shards failed) at S0, S1 and S2: every state the run had.
STATES = {(0, 1), (1, 0), (1, 1)}


def _batch_read(db: Any, table: str) -> tuple[int, int]:
    """The counters summed from one BatchGetItem: how they were read before."""
    keys = [item({"pk": RUN, "sk": counter_sk(k)}) for k in range(COUNTER_SHARDS)]
    resp = db.batch_get_item(RequestItems={table: {"Keys": keys, "ConsistentRead": True}})
    rows = [values(r) for r in resp["Responses"].get(table, [])]
    return sum(int(r.get("shards_succeeded", 0)) for r in rows), sum(int(r.get("shards_failed", 0)) for r in rows)


def test_a_batch_read_item_by_item_can_sum_to_a_state_that_never_existed(aws, stack):
    # The model has teeth: a transaction landing between two item reads tears the sum.
    table = stack.names["RunsTable"]
    db = Contended(aws.dynamodb)
    records = ShardRecords(db, table)
    _s0(records)
    reads = {"n": 0}

    def land_transactions() -> None:
        reads["n"] += 1
        if reads["n"] == 2:  # COUNT#00 and COUNT#01 (shard 1's) read; COUNT#02 (shard 2's) not yet
            _s1_then_s2(records)

    db.between_items = land_transactions
    torn = _batch_read(db, table)
    assert torn == (0, 2) and torn not in STATES


def test_the_counters_are_one_snapshot_while_transactions_land(aws, stack):
    table = stack.names["RunsTable"]
    db = Contended(aws.dynamodb, hold_s=0.15)  # each shard transaction stays in flight 0.15 s
    records = ShardRecords(db, table)
    _s0(records)
    ddb.STATS.clear()
    writer = threading.Thread(target=_s1_then_s2, args=(records,))
    writer.start()
    time.sleep(0.1)  # shard 1's transaction is in flight: a serializable read is cancelled
    seen = []
    while writer.is_alive():
        try:
            c = records.counts(RUN)
        except RetriableError:  # cancelled on every try: Lambda would deliver the event again
            continue
        seen.append((c.shards_succeeded, c.shards_failed))
    writer.join()
    c = records.counts(RUN)
    seen.append((c.shards_succeeded, c.shards_failed))
    assert set(seen) <= STATES, seen
    assert seen[-1] == (1, 1)
    assert db.conflicts > 0 and ddb.STATS["reads_retried"] > 0  # the read met a transaction and was retried
