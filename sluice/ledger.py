"""DynamoDB run ledger: one item per run (pk=<run id>, sk="RUN"), conditional writes only.

The claim is a conditional put: the first delivery of an upload creates the item, later
deliveries find it and stop. A claim whose holder died (lease expired) or released it
after a transient failure can be taken over, so a crash never strands a run.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import BotoCoreError, ClientError

from sluice.errors import RetriableError

RUN_SK = "RUN"
LIST_PK = "RUNS"  # gsi1 partition: lists runs by created_at (a few writes per run)
TTL_DAYS = 90
_ser, _de = TypeSerializer(), TypeDeserializer()


def _item(values: dict[str, Any]) -> dict[str, Any]:
    return {k: _ser.serialize(v) for k, v in values.items() if v is not None}


class Ledger:
    """The runs table; the boto3 DynamoDB client is injected or created lazily."""

    def __init__(self, client: Any, table: str) -> None:
        self._client = client
        self._table = table

    @property
    def table(self) -> str:
        return self._table

    def _call(self, op: str, **kwargs: Any) -> Any:
        try:
            return getattr(self._client, op)(TableName=self._table, **kwargs)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                raise
            raise RetriableError(f"DynamoDB {op} on {self._table!r} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise RetriableError(f"DynamoDB {op} on {self._table!r} failed: {exc}") from exc

    def claim(self, run_id: str, manifest_uri: str, *, lease_s: int = 900, now: float | None = None) -> bool:
        """Create the run item (status PLANNING). False when another delivery already has it."""
        now = time.time() if now is None else now
        item = _item(
            {
                "pk": run_id,
                "sk": RUN_SK,
                "gsi1pk": LIST_PK,
                "run_id": run_id,
                "status": "PLANNING",
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
                ExpressionAttributeValues=_item({":released": "RELEASED", ":planning": "PLANNING", ":now": int(now)}),
            )
        except ClientError:
            return False
        return True

    def _update(self, run_id: str, values: dict[str, Any], expect: str = "PLANNING") -> None:
        values = {**values, "updated_at": int(time.time())}
        names = {f"#{i}": k for i, k in enumerate(values)}
        sets = ", ".join(f"#{i} = :{i}" for i in range(len(values)))
        self._call(
            "update_item",
            Key=_item({"pk": run_id, "sk": RUN_SK}),
            UpdateExpression=f"SET {sets} REMOVE lease_until",
            ConditionExpression="#s = :expect",
            ExpressionAttributeNames={**names, "#s": "status"},
            ExpressionAttributeValues={
                **{f":{i}": _ser.serialize(v) for i, v in enumerate(values.values())},
                ":expect": _ser.serialize(expect),
            },
        )

    def mark_rejected(self, run_id: str, reasons: list[str]) -> None:
        """PLANNING -> REJECTED with the reasons."""
        self._update(run_id, {"status": "REJECTED", "reasons": reasons[:50]})

    def mark_submitted(self, run_id: str, fields: dict[str, Any]) -> None:
        """PLANNING -> SUBMITTED with counts, job ids and where the plan lives."""
        self._update(run_id, {**fields, "status": "SUBMITTED"})

    def mark_failed(self, run_id: str, reason: str) -> None:
        """PLANNING -> FAILED (a fatal error before any job ran)."""
        self._update(run_id, {"status": "FAILED", "reason": reason})

    def release(self, run_id: str, error: str) -> None:
        """PLANNING -> RELEASED after a transient error, so the retried delivery can claim it."""
        self._update(run_id, {"status": "RELEASED", "last_error": error[:1000]})

    def get(self, run_id: str) -> dict[str, Any] | None:
        """The run item as plain Python values, or None."""
        resp = self._call("get_item", Key=_item({"pk": run_id, "sk": RUN_SK}), ConsistentRead=True)
        raw = resp.get("Item")
        return {k: _de.deserialize(v) for k, v in raw.items()} if raw else None

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
                if "ConditionalCheckFailed" in reasons and not {"ThrottlingError", "TransactionConflict"} & set(
                    reasons
                ):
                    return False
            raise RetriableError(f"DynamoDB transaction on {self._table!r} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise RetriableError(f"DynamoDB transaction on {self._table!r} failed: {exc}") from exc
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
        names = {f"#f{i}": k for i, k in enumerate(fields)}
        vals = {f":f{i}": _ser.serialize(v) for i, v in enumerate(fields.values())}
        sets = ", ".join(f"#f{i} = :f{i}" for i in range(len(fields)))
        update = {
            "Key": _item({"pk": run_id, "sk": f"SHARD#{shard:06d}"}),
            "UpdateExpression": f"SET {sets}",
            "ConditionExpression": "(attribute_not_exists(#f_seq) OR #f_seq < :seq) AND attribute_not_exists(terminal)",
            "ExpressionAttributeNames": {**names, "#f_seq": "seq"},
            "ExpressionAttributeValues": {**vals, ":seq": _ser.serialize(seq)},
        }
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

    def record_job_terminal(self, run_id: str, job_id: str, status: str, reason: str | None) -> bool:
        """Count a submitted job as done (once, whatever the duplicates). True the first time."""
        now = int(time.time())
        adds = "ADD jobs_done :one" + (", jobs_failed :one" if status == "FAILED" else "")
        return self._transact(
            [
                {
                    "Put": {
                        "Item": _item(
                            {"pk": run_id, "sk": f"JOB#{job_id}", "status": status, "reason": reason, "updated_at": now}
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
            self._update(run_id, {"status": "RUNNING"}, expect="SUBMITTED")

    def begin_finalize(self, run_id: str, *, lease_s: int = 600, now: float | None = None) -> dict[str, Any] | None:
        """Claim the right to decide the run's outcome; None when someone else has it or it is decided."""
        now = time.time() if now is None else now
        try:
            resp = self._call(
                "update_item",
                Key=_item({"pk": run_id, "sk": RUN_SK}),
                UpdateExpression="SET #s = :fin, finalize_from = #s, lease_until = :lease, updated_at = :now",
                ConditionExpression="#s IN (:sub, :run, :retry) OR (#s = :fin AND lease_until < :now)",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues=_item(
                    {
                        ":fin": "FINALIZING",
                        ":sub": "SUBMITTED",
                        ":run": "RUNNING",
                        ":retry": "RETRYING",
                        ":lease": int(now + lease_s),
                        ":now": int(now),
                    }
                ),
                ReturnValues="ALL_NEW",
            )
        except ClientError:
            return None
        return {k: _de.deserialize(v) for k, v in resp["Attributes"].items()}

    def finish(self, run_id: str, status: str, fields: dict[str, Any]) -> None:
        """FINALIZING -> SUCCEEDED | FAILED | RETRYING with the given fields."""
        self._update(run_id, {**fields, "status": status}, expect="FINALIZING")

    def release_finalize(self, run_id: str, previous: str) -> None:
        """FINALIZING -> previous status after a transient error (the retried event finalizes)."""
        self._update(run_id, {"status": previous}, expect="FINALIZING")

    def shard_items(self, run_id: str) -> list[dict[str, Any]]:
        """Every shard record of the run."""
        out: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "KeyConditionExpression": "pk = :pk AND begins_with(sk, :p)",
            "ExpressionAttributeValues": _item({":pk": run_id, ":p": "SHARD#"}),
            "ConsistentRead": True,
        }
        while True:
            resp = self._call("query", **kwargs)
            out += [{k: _de.deserialize(v) for k, v in i.items()} for i in resp.get("Items", [])]
            if "LastEvaluatedKey" not in resp:
                return out
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]

    def recent_runs(self, limit: int = 20) -> list[dict[str, Any]]:
        """Newest runs first (gsi1: gsi1pk = RUNS, sorted by created_at)."""
        resp = self._call(
            "query",
            IndexName="gsi1",
            KeyConditionExpression="gsi1pk = :p",
            ExpressionAttributeValues=_item({":p": LIST_PK}),
            ScanIndexForward=False,
            Limit=limit,
        )
        return [{k: _de.deserialize(v) for k, v in i.items()} for i in resp.get("Items", [])]
