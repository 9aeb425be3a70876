"""DynamoDB run ledger: one item per run (pk=<run id>, sk="RUN"), conditional writes only.

The claim is a conditional put: the first delivery of an upload creates the item, later
deliveries find it and stop. A claim whose holder died (lease expired) or released it
after a transient failure can be taken over, so a crash never strands a run.
"""

from __future__ import annotations

import contextlib
import time
from enum import Enum
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel

from sluice.awserror import Kind, classify, translate
from sluice.contracts import JobStatus, RunItem, RunStatus, ShardItem
from sluice.errors import AwsFatalError, RetriableError

RUN_SK = "RUN"
LIST_PK = "RUNS"  # gsi1 partition: lists runs by created_at (a few writes per run)
TTL_DAYS = 90
_ser, _de = TypeSerializer(), TypeDeserializer()
_RUN_FIELDS = frozenset(RunItem.model_fields)


def _plain(v: Any) -> Any:
    """Enums, models and tuples as the plain values DynamoDB's serializer takes."""
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, BaseModel):
        return v.model_dump(mode="json", exclude_none=True)
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _item(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _ser.serialize(_plain(v)) for k, v in values.items() if v is not None}


def _values(raw: dict[str, Any]) -> dict[str, Any]:
    return {k: _de.deserialize(v) for k, v in raw.items()}


def _set_clause(values: dict[str, Any]) -> tuple[str, dict[str, str], dict[str, Any]]:
    """'#0 = :0, #1 = :1', its attribute names and its serialized values."""
    names = {f"#{i}": k for i, k in enumerate(values)}
    vals = {f":{i}": _ser.serialize(_plain(v)) for i, v in enumerate(values.values())}
    return ", ".join(f"#{i} = :{i}" for i in range(len(values))), names, vals


def _shard_update(run_id: str, shard: int, fields: dict[str, Any], seq: int) -> dict[str, Any]:
    """The conditional update of a SHARD item: applies only if newer (seq) and not yet terminal."""
    sets, names, vals = _set_clause(fields)
    return {
        "Key": _item({"pk": run_id, "sk": shard_sk(shard)}),
        "UpdateExpression": f"SET {sets}",
        "ConditionExpression": "(attribute_not_exists(#seq) OR #seq < :seq) AND attribute_not_exists(terminal)",
        "ExpressionAttributeNames": {**names, "#seq": "seq"},
        "ExpressionAttributeValues": {**vals, ":seq": _ser.serialize(seq)},
    }


def shard_sk(shard: int) -> str:
    return f"SHARD#{shard:06d}"


def job_sk(job_id: str) -> str:
    return f"JOB#{job_id}"


class Ledger:
    """The runs table; the boto3 DynamoDB client is injected or created lazily."""

    def __init__(self, client: Any, table: str) -> None:
        self._client = client
        self._table = table

    @property
    def table(self) -> str:
        return self._table

    def _call(self, op: str, **kwargs: Any) -> Any:
        """One DynamoDB call; a lost condition stays a ClientError, anything else is translated once."""
        try:
            return getattr(self._client, op)(TableName=self._table, **kwargs)
        except (ClientError, BotoCoreError) as exc:
            if classify(exc).kind is Kind.CONDITION:
                raise
            raise translate(exc, f"DynamoDB {op} on table {self._table!r}") from exc

    def claim(self, run_id: str, manifest_uri: str, *, lease_s: int = 900, now: float | None = None) -> bool:
        """Create the run item (status PLANNING). False when another delivery already has it."""
        now = time.time() if now is None else now
        item = _item(
            {
                "pk": run_id,
                "sk": RUN_SK,
                "gsi1pk": LIST_PK,
                "run_id": run_id,
                "status": RunStatus.PLANNING,
                "manifest_uri": manifest_uri,
                "created_at": int(now),
                "updated_at": int(now),
                "lease_until": int(now + lease_s),
                "expires_at": int(now + TTL_DAYS * 86400),
            }
        )
        try:
            self._call(
                "put_item",
                Item=item,
                ConditionExpression="attribute_not_exists(pk) OR #s = :released OR "
                "(#s = :planning AND lease_until < :now)",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues=_item(
                    {":released": RunStatus.RELEASED, ":planning": RunStatus.PLANNING, ":now": int(now)}
                ),
            )
        except ClientError:
            return False
        return True

    def _update(self, run_id: str, values: dict[str, Any], expect: RunStatus = RunStatus.PLANNING) -> None:
        unknown = set(values) - _RUN_FIELDS
        if unknown:  # the RUN item's fields are a contract (sluice.contracts.RunItem)
            raise ValueError(f"not fields of the RUN item: {sorted(unknown)}")
        sets, names, vals = _set_clause({**values, "updated_at": int(time.time())})
        self._call(
            "update_item",
            Key=_item({"pk": run_id, "sk": RUN_SK}),
            UpdateExpression=f"SET {sets} REMOVE lease_until",
            ConditionExpression="#s = :expect",
            ExpressionAttributeNames={**names, "#s": "status"},
            ExpressionAttributeValues={**vals, ":expect": _ser.serialize(expect.value)},
        )

    def mark_rejected(self, run_id: str, reasons: list[str]) -> None:
        """PLANNING -> REJECTED with the reasons."""
        self._update(run_id, {"status": RunStatus.REJECTED, "reasons": reasons[:50]})

    def mark_submitted(self, run_id: str, fields: dict[str, Any]) -> None:
        """PLANNING -> SUBMITTED with counts, job ids and where the plan lives."""
        self._update(run_id, {**fields, "status": RunStatus.SUBMITTED})

    def mark_failed(self, run_id: str, reason: str) -> None:
        """PLANNING -> FAILED (a fatal error before any job ran)."""
        self._update(run_id, {"status": RunStatus.FAILED, "reason": reason})

    def release(self, run_id: str, error: str) -> None:
        """PLANNING -> RELEASED after a transient error, so the retried delivery can claim it."""
        self._update(run_id, {"status": RunStatus.RELEASED, "last_error": error[:1000]})

    def get(self, run_id: str) -> RunItem | None:
        """The RUN item, or None."""
        resp = self._call("get_item", Key=_item({"pk": run_id, "sk": RUN_SK}), ConsistentRead=True)
        raw = resp.get("Item")
        return RunItem.model_validate(_values(raw)) if raw else None

    # ---- completion: per-shard and per-job records, run aggregates -------------------------

    def _transact(self, items: list[dict[str, Any]]) -> bool:
        """TransactWriteItems; False when a condition failed (a duplicate or stale event)."""
        for it in items:
            next(iter(it.values()))["TableName"] = self._table
        try:
            self._client.transact_write_items(TransactItems=items)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "TransactionCanceledException":
                reasons = [r.get("Code") for r in exc.response.get("CancellationReasons", [])]
                transient = [r for r in reasons if r and classify(_cancelled(r)).retriable]
                if transient:
                    raise RetriableError(
                        f"DynamoDB transaction on table {self._table!r} cancelled ({', '.join(transient)}); will retry"
                    ) from exc
                if "ConditionalCheckFailed" in reasons:
                    return False
                raise AwsFatalError(
                    f"DynamoDB transaction on table {self._table!r} cancelled: {reasons}; "
                    "check the items' keys and types (sluice.contracts)"
                ) from exc
            raise translate(exc, f"DynamoDB TransactWriteItems on table {self._table!r}") from exc
        except BotoCoreError as exc:
            raise translate(exc, f"DynamoDB TransactWriteItems on table {self._table!r}") from exc
        return True

    def record_shard(
        self,
        run_id: str,
        shard: int,
        values: dict[str, Any],
        *,
        seq: int,
        terminal: bool,
        failed: bool,
        keys_processed: int = 0,
        keys_failed: int = 0,
    ) -> bool:
        """Apply a shard's state if it is newer (seq) than what is stored and the shard is not final.

        Terminal states also bump the run's shards_succeeded / shards_failed in the same
        transaction, so concurrent invocations never lose or double a count.
        Returns True when the state was applied.
        """
        now = int(time.time())
        fields = {k: v for k, v in {**values, "seq": seq, "shard": shard, "updated_at": now}.items() if v is not None}
        if terminal:
            fields["terminal"] = True
        update = _shard_update(run_id, shard, fields, seq)
        if not terminal:
            try:
                self._call("update_item", **update)
            except ClientError:
                return False
            return True
        counter = "shards_failed" if failed else "shards_succeeded"
        return self._transact(
            [
                {"Update": update},
                {
                    "Update": {
                        "Key": _item({"pk": run_id, "sk": RUN_SK}),
                        "UpdateExpression": "ADD #c :one, keys_processed :kp, keys_failed :kf SET updated_at = :now",
                        "ConditionExpression": "attribute_exists(pk)",
                        "ExpressionAttributeNames": {"#c": counter},
                        "ExpressionAttributeValues": _item(
                            {":one": 1, ":now": now, ":kp": keys_processed, ":kf": keys_failed}
                        ),
                    }
                },
            ]
        )

    def record_job_terminal(self, run_id: str, job_id: str, status: JobStatus, reason: str | None) -> bool:
        """Count a submitted job as done (once, whatever the duplicates). True the first time."""
        now = int(time.time())
        adds = "ADD jobs_done :one" + (", jobs_failed :one" if status == JobStatus.FAILED else "")
        return self._transact(
            [
                {
                    "Put": {
                        "Item": _item(
                            {"pk": run_id, "sk": job_sk(job_id), "status": status, "reason": reason, "updated_at": now}
                        ),
                        "ConditionExpression": "attribute_not_exists(sk)",
                    }
                },
                {
                    "Update": {
                        "Key": _item({"pk": run_id, "sk": RUN_SK}),
                        "UpdateExpression": f"{adds} SET updated_at = :now",
                        "ConditionExpression": "attribute_exists(pk)",
                        "ExpressionAttributeValues": _item({":one": 1, ":now": now}),
                    }
                },
            ]
        )

    def mark_running(self, run_id: str) -> None:
        """SUBMITTED -> RUNNING (first RUNNING event); a no-op otherwise."""
        with contextlib.suppress(ClientError):
            self._update(run_id, {"status": RunStatus.RUNNING}, expect=RunStatus.SUBMITTED)

    def begin_finalize(self, run_id: str, *, lease_s: int = 600, now: float | None = None) -> RunItem | None:
        """Claim the right to decide the run's outcome; None when someone else has it or it is decided."""
        now = time.time() if now is None else now
        active = {f":a{i}": s for i, s in enumerate(s for s in RunStatus if s.active)}
        try:
            resp = self._call(
                "update_item",
                Key=_item({"pk": run_id, "sk": RUN_SK}),
                UpdateExpression="SET #s = :fin, finalize_from = #s, lease_until = :lease, updated_at = :now",
                ConditionExpression=f"#s IN ({', '.join(active)}) OR (#s = :fin AND lease_until < :now)",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues=_item(
                    {**active, ":fin": RunStatus.FINALIZING, ":lease": int(now + lease_s), ":now": int(now)}
                ),
                ReturnValues="ALL_NEW",
            )
        except ClientError:
            return None
        return RunItem.model_validate(_values(resp["Attributes"]))

    def leave_finalizing(self, run_id: str, status: RunStatus, fields: dict[str, Any]) -> None:
        """FINALIZING -> SUCCEEDED | FAILED (the outcome) or RETRYING (a retry pass), with the given fields."""
        self._update(run_id, {**fields, "status": status}, expect=RunStatus.FINALIZING)

    def release_finalize(self, run_id: str, previous: RunStatus) -> None:
        """FINALIZING -> previous status after a transient error (the retried event finalizes)."""
        self._update(run_id, {"status": previous}, expect=RunStatus.FINALIZING)

    def shard_items(self, run_id: str) -> list[ShardItem]:
        """Every shard record of the run."""
        out: list[ShardItem] = []
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :p)",
            "ExpressionAttributeValues": _item({":pk": run_id, ":p": "SHARD#"}),
            "ConsistentRead": True,
        }
        while True:
            resp = self._call("query", **kwargs)
            out += [ShardItem.model_validate(_values(i)) for i in resp.get("Items", [])]
            if "LastEvaluatedKey" not in resp:
                return out
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def recent_runs(self, limit: int = 20) -> list[RunItem]:
        """Newest runs first (gsi1: gsi1pk = RUNS, sorted by created_at)."""
        resp = self._call(
            "query",
            IndexName="gsi1",
            KeyConditionExpression="gsi1pk = :p",
            ExpressionAttributeValues=_item({":p": LIST_PK}),
            ScanIndexForward=False,
            Limit=limit,
        )
        return [RunItem.model_validate(_values(i)) for i in resp.get("Items", [])]


def _cancelled(code: str) -> ClientError:
    """A TransactWriteItems cancellation reason as a ClientError, so the one classification applies."""
    return ClientError({"Error": {"Code": code, "Message": ""}}, "TransactWriteItems")
