"""The runs table's SHARD, JOB and COUNT items: what every shard and job of a run came to.

A shard keeps the state of its newest event (seq = attempt * 10 + state rank): duplicates
and late events change nothing, and a later attempt outranks an earlier one, even a
terminal one (an MNP job retried after a host loss). A terminal state is written with its
settlement (outcome and the worker's counts), the matching change to one of the run's
COUNTER_SHARDS counter items and its marks (FAIL#<i> while it failed, RETRY#<i> while it has
transient failures), in one transaction whose condition is the seq it replaces.
The counters are write-sharded so that a burst of events on one run does not serialise on
a single item (TransactWriteItems conflicts when two transactions touch one item).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from botocore.exceptions import ClientError

from sluice.contracts.status import FailureReason, JobStatus
from sluice.control.completion.verdict import Settlement
from sluice.control.table.ddb import Table, item, value, values
from sluice.control.table.items import CounterItem, Counts, JobItem, MarkItem, ShardItem, ShardOutcome, reason_counter
from sluice.control.table.ledger import RUN_SK
from sluice.errors import RetriableError

# One counter item per 16th of the shards: DynamoDB supports 1,000 WCU/s per partition key
# value and a transactional write costs 2 WCU per item, so the run's items take a burst of a
# few hundred terminal events a second; 16 items keep concurrent completion invocations
# (reserved concurrency, template.yaml) from conflicting on the same counter.
COUNTER_SHARDS = 16
RECORD_TRIES = 8  # optimistic (read, conditional write) rounds before the event is retried
_TOTALS = (
    "shards_succeeded",
    "shards_failed",
    "keys_processed",
    "keys_failed",
    "keys_transient",
    "gpu_seconds",
    "parts_embedded",
    "media_ms",
)
_REASONS = {reason_counter(r): r for r in FailureReason}
_COUNTED = (*_TOTALS, *_REASONS)


def shard_sk(shard: int) -> str:
    return f"SHARD#{shard:06d}"


def job_sk(job_id: str) -> str:
    return f"JOB#{job_id}"


def counter_sk(k: int) -> str:
    return f"COUNT#{k:02d}"


FAIL, RETRY = "FAIL#", "RETRY#"  # MarkItem prefixes: the shard failed / has transient failures


def _marks(s: ShardItem | None) -> dict[str, str | None]:
    """prefix -> why, for each mark a (terminal) shard item carries."""
    if s is None or not s.terminal or s.outcome is None:
        return {}
    out: dict[str, str | None] = {}
    if s.outcome == ShardOutcome.FAILED:
        out[FAIL] = s.why or "failed"
    if s.failed_transient:
        out[RETRY] = None
    return out


def _contribution(s: ShardItem | None) -> dict[str, int]:
    """What a (terminal) shard item adds to the run's counters."""
    if s is None or not s.terminal or s.outcome is None:
        return dict.fromkeys(_COUNTED, 0)
    ok = s.outcome == ShardOutcome.SUCCEEDED
    by_reason = {reason_counter(r): n for r, n in s.failed_by_reason.items()}
    return {
        **dict.fromkeys(_REASONS, 0),
        **by_reason,
        "shards_succeeded": int(ok),
        "shards_failed": int(not ok),
        "keys_processed": s.processed,
        "keys_failed": s.failed_keys,
        "keys_transient": s.failed_transient,
        "gpu_seconds": s.gpu_seconds,
        "parts_embedded": s.parts_embedded,
        "media_ms": s.media_ms,
    }


def _mark_ops(run_id: str, shard: int, had: dict[str, str | None], has: dict[str, str | None]) -> list[dict[str, Any]]:
    """Puts for the marks the new state carries (its why may have changed), deletes for those it dropped."""
    ops: list[dict[str, Any]] = []
    for prefix in (FAIL, RETRY):
        key = {"pk": run_id, "sk": f"{prefix}{shard:06d}"}
        if prefix in has:
            mark = MarkItem(**key, shard=shard, updated_at=int(time.time()), why=has[prefix])
            ops.append({"Put": {"Item": item(mark.model_dump(mode="json", exclude_none=True))}})
        elif prefix in had:
            ops.append({"Delete": {"Key": item(key)}})
    return ops


class ShardRecords(Table):
    """SHARD, JOB and COUNT items of the runs table."""

    def shard(self, run_id: str, shard: int) -> ShardItem | None:
        resp = self.call("get_item", Key=item({"pk": run_id, "sk": shard_sk(shard)}), ConsistentRead=True)
        raw = resp.get("Item")
        return ShardItem.model_validate(values(raw)) if raw else None

    def record_shard(
        self,
        run_id: str,
        shard: int,
        state: dict[str, Any],
        *,
        seq: int,
        settlement: Settlement | None = None,
    ) -> bool:
        """Apply a shard's state if it is newer (seq) than the stored one. True when applied.

        `settlement` (terminal states only) is stored with it and counted; the contribution of
        a terminal state it replaces is taken back in the same transaction.
        """
        new = self._new_item(run_id, shard, state, seq, settlement)
        # First round without a read: most events find no item or an older non-terminal one
        # (which counts for nothing), so one conditional write settles them.
        if self._write(run_id, shard, None, new, replaces_waiting=True):
            return True
        for _ in range(RECORD_TRIES):
            old = self.shard(run_id, shard)
            if old is not None and old.seq >= seq:
                return False
            if self._write(run_id, shard, old, new):
                return True
        raise RetriableError(f"shard {shard} of run {run_id} kept changing under {RECORD_TRIES} writes; will retry")

    @staticmethod
    def _new_item(run_id: str, shard: int, state: dict[str, Any], seq: int, settlement: Settlement | None) -> ShardItem:
        fields = {k: v for k, v in state.items() if v is not None}
        extra: dict[str, Any] = {"terminal": True, **asdict(settlement)} if settlement else {}
        return ShardItem(
            pk=run_id, sk=shard_sk(shard), shard=shard, seq=seq, updated_at=int(time.time()), **fields, **extra
        )

    def _write(
        self, run_id: str, shard: int, old: ShardItem | None, new: ShardItem, *, replaces_waiting: bool = False
    ) -> bool:
        """Replace `old` by `new` if nobody changed it meanwhile; counters move with it.

        `replaces_waiting`: `old` is unknown (None); the write also replaces an older non-terminal
        item, whose contribution, like a missing item's, is zero.
        """
        put: dict[str, Any] = {"Item": item(new.model_dump(mode="json", exclude_none=True))}
        if replaces_waiting:
            put["ConditionExpression"] = "attribute_not_exists(sk) OR (#seq < :new AND attribute_not_exists(terminal))"
            put["ExpressionAttributeNames"] = {"#seq": "seq"}
            put["ExpressionAttributeValues"] = {":new": value(new.seq)}
        elif old is None:
            put["ConditionExpression"] = "attribute_not_exists(sk)"
        else:
            put["ConditionExpression"] = "#seq = :old"
            put["ExpressionAttributeNames"] = {"#seq": "seq"}
            put["ExpressionAttributeValues"] = {":old": value(old.seq)}
        before, after = _contribution(old), _contribution(new)
        delta = {k: after[k] - before[k] for k in _COUNTED if after[k] != before[k]}
        ops: list[dict[str, Any]] = [{"Put": put}]
        if delta:
            adds = ", ".join(f"{k} :{k}" for k in delta)
            now = int(time.time())
            ops.append(
                {
                    "Update": {
                        "Key": item({"pk": run_id, "sk": counter_sk(shard % COUNTER_SHARDS)}),
                        "UpdateExpression": f"ADD {adds} SET updated_at = :now",
                        "ExpressionAttributeValues": item({**{f":{k}": v for k, v in delta.items()}, ":now": now}),
                    }
                }
            )
        ops += _mark_ops(run_id, shard, _marks(old), _marks(new))
        if len(ops) == 1:
            try:
                self.call("put_item", **put)
            except ClientError:
                return False
            return True
        return self.transact(ops)

    def record_job_terminal(self, run_id: str, job_id: str, status: JobStatus, reason: str | None) -> bool:
        """Count a submitted job as done (once, whatever the duplicates). True the first time."""
        now = int(time.time())
        adds = "ADD jobs_done :one" + (", jobs_failed :one" if status == JobStatus.FAILED else "")
        job = JobItem(pk=run_id, sk=job_sk(job_id), status=status, reason=reason, updated_at=now)
        return self.transact(
            [
                {
                    "Put": {
                        "Item": item(job.model_dump(mode="json", exclude_none=True)),
                        "ConditionExpression": "attribute_not_exists(sk)",
                    }
                },
                {
                    "Update": {
                        "Key": item({"pk": run_id, "sk": RUN_SK}),
                        "UpdateExpression": f"{adds} SET updated_at = :now",
                        "ConditionExpression": "attribute_exists(pk)",
                        "ExpressionAttributeValues": item({":one": 1, ":now": now}),
                    }
                },
            ]
        )

    def counts(self, run_id: str) -> Counts:
        """The run's counters as one snapshot: one TransactGetItems of its COUNTER_SHARDS items.

        Not BatchGetItem: it reads each item at its own moment (read-committed), so beside a
        shard's transaction it can return a sum that never existed (a shard counted twice, or
        half of it). The sum decides "every shard settled" and is published, so it is read
        serializably (docs/architecture.md, "Counters").
        """
        keys = [item({"pk": run_id, "sk": counter_sk(k)}) for k in range(COUNTER_SHARDS)]
        total = Counts()
        for raw in self.transact_get(keys):
            if raw is None:
                continue
            c = CounterItem.model_validate(raw)
            for k in _TOTALS:
                setattr(total, k, getattr(total, k) + getattr(c, k))
            for k, r in _REASONS.items():
                if getattr(c, k):
                    total.failed_by_reason[r] = total.failed_by_reason.get(r, 0) + getattr(c, k)
        return total

    def _query(self, run_id: str, prefix: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :p)",
            "ExpressionAttributeValues": item({":pk": run_id, ":p": prefix}),
            "ConsistentRead": True,
        }
        while True:
            resp = self.call("query", **kwargs)
            out += [values(i) for i in resp.get("Items", [])]
            if "LastEvaluatedKey" not in resp:
                return out
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def marks(self, run_id: str, prefix: str) -> list[MarkItem]:
        """The run's FAIL# or RETRY# items: one per failed shard, or per shard with transient failures."""
        return [MarkItem.model_validate(v) for v in self._query(run_id, prefix)]

    def shard_items(self, run_id: str) -> list[ShardItem]:
        """Every shard item of the run (paginated: 1 MB a page)."""
        return [ShardItem.model_validate(v) for v in self._query(run_id, "SHARD#")]

    def job_items(self, run_id: str) -> list[JobItem]:
        """The terminal status of every job that has one."""
        return [JobItem.model_validate(v) for v in self._query(run_id, "JOB#")]


__all__ = ["COUNTER_SHARDS", "FAIL", "RETRY", "ShardRecords", "counter_sk", "job_sk", "shard_sk"]
