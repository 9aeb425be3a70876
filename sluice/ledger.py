"""DynamoDB run ledger: one item per run (pk=<run id>, sk="RUN"), conditional writes only.

The claim is a conditional put: the first delivery of an upload creates the item, later
deliveries find it and stop. A claim whose holder died (lease expired) or released it
after a transient failure can be taken over, so a crash never strands a run.
"""

from __future__ import annotations

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
