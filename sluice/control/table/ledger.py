"""The runs table's RUN items (pk=<run id>, sk="RUN"): claims and conditional transitions only.

The claim is a conditional put: the first delivery of an upload creates the item, later
deliveries find it and stop. A claim whose holder died (lease expired) or released it
after a transient failure can be taken over, so a crash never strands a run. Every
transition that decides an event writes it to the item's outbox in the same update
(sluice.control.outbox publishes it), so no announcement is lost between the two. Shards, jobs
and counters are sluice.control.table.records's.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from botocore.exceptions import ClientError

from sluice.contracts.events import EventDetail
from sluice.contracts.status import RunStatus
from sluice.control.table.ddb import Table, item, set_clause, value, values
from sluice.control.table.items import OutboxEvent, PrepareItem, RunItem, UploadItem

RUN_SK = "RUN"
LIST_PK = "RUNS"  # gsi1 partition: lists runs by created_at (a few writes per run)
TTL_DAYS = 90
_RUN_FIELDS = frozenset(RunItem.model_fields)


def staged(detail: EventDetail) -> OutboxEvent:
    """An event as the RUN item's outbox holds it."""
    return OutboxEvent(detail_type=detail.detail_type, detail=detail.model_dump_json())


class Ledger(Table):
    """RUN items; the boto3 DynamoDB client is injected or created lazily."""

    def claim(
        self,
        run_id: str,
        manifest_uri: str,
        *,
        upload: UploadItem | None = None,
        lease_s: int = 900,
        now: float | None = None,
    ) -> bool:
        """Create the run item (status PLANNING). False when another delivery already has it.

        The lease is the manifest function's timeout (900 s): a live holder is never taken over.
        """
        now = time.time() if now is None else now
        new = item(
            {
                "pk": run_id,
                "sk": RUN_SK,
                "gsi1pk": LIST_PK,
                "run_id": run_id,
                "status": RunStatus.PLANNING,
                "manifest_uri": manifest_uri,
                "upload": upload,
                "created_at": int(now),
                "updated_at": int(now),
                "lease_until": int(now + lease_s),
                "expires_at": int(now + TTL_DAYS * 86400),
            }
        )
        try:
            self.call(
                "put_item",
                Item=new,
                ConditionExpression="attribute_not_exists(pk) OR #s = :released OR "
                "(#s = :planning AND lease_until < :now)",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues=item(
                    {":released": RunStatus.RELEASED, ":planning": RunStatus.PLANNING, ":now": int(now)}
                ),
            )
        except ClientError:
            return False
        return True

    def _update(
        self,
        run_id: str,
        fields: dict[str, Any],
        expect: RunStatus = RunStatus.PLANNING,
        outbox: EventDetail | None = None,
    ) -> None:
        if outbox is not None:
            fields = {**fields, "outbox": staged(outbox)}
        unknown = set(fields) - _RUN_FIELDS
        if unknown:  # the RUN item's fields are a contract (sluice.control.table.items.RunItem)
            raise ValueError(f"not fields of the RUN item: {sorted(unknown)}")
        sets, names, vals = set_clause({**fields, "updated_at": int(time.time())})
        self.call(
            "update_item",
            Key=item({"pk": run_id, "sk": RUN_SK}),
            UpdateExpression=f"SET {sets} REMOVE lease_until",
            ConditionExpression="#s = :expect",
            ExpressionAttributeNames={**names, "#s": "status"},
            ExpressionAttributeValues={**vals, ":expect": value(expect)},
        )

    def mark_rejected(
        self, run_id: str, reasons: list[str], outbox: EventDetail, *, expect: RunStatus = RunStatus.PLANNING
    ) -> None:
        """PLANNING (or PREPARING) -> REJECTED with the reasons (and the "Manifest Rejected" to publish)."""
        self._update(run_id, {"status": RunStatus.REJECTED, "reasons": reasons[:50]}, expect, outbox)

    def mark_preparing(self, run_id: str, prepare: PrepareItem, outbox: EventDetail) -> None:
        """PLANNING -> PREPARING with the prepare jobs (and "Run Preparing")."""
        self._update(run_id, {"status": RunStatus.PREPARING, "prepare": prepare}, outbox=outbox)

    def mark_submitted(
        self, run_id: str, fields: dict[str, Any], outbox: EventDetail, *, expect: RunStatus = RunStatus.PLANNING
    ) -> None:
        """PLANNING (or PREPARING) -> SUBMITTED with counts, job ids and the plan (and "Run Submitted")."""
        self._update(run_id, {**fields, "status": RunStatus.SUBMITTED}, expect, outbox)

    def mark_failed(
        self, run_id: str, reason: str, outbox: EventDetail, *, expect: RunStatus = RunStatus.PLANNING
    ) -> None:
        """PLANNING (or PREPARING) -> FAILED (a fatal error before any job ran), with its "Run Failed"."""
        self._update(run_id, {"status": RunStatus.FAILED, "reason": reason}, expect, outbox)

    def release(self, run_id: str, error: str) -> bool:
        """PLANNING -> RELEASED after a transient error, so the retried delivery can claim it.

        False when the run is no longer PLANNING (it got further: the redelivery finishes
        what is left), so the caller's own error is the one that surfaces.
        """
        try:
            self._update(run_id, {"status": RunStatus.RELEASED, "last_error": error[:1000]})
        except ClientError:
            return False
        return True

    def get(self, run_id: str) -> RunItem | None:
        """The RUN item, or None."""
        resp = self.call("get_item", Key=item({"pk": run_id, "sk": RUN_SK}), ConsistentRead=True)
        raw = resp.get("Item")
        return RunItem.model_validate(values(raw)) if raw else None

    def claim_outbox(self, run_id: str, *, lease_s: int = 60, now: float | None = None) -> OutboxEvent | None:
        """Take the right to publish the pending event: the event the item holds now, or None when
        there is none or another invocation holds it.

        Concurrent invocations see the same pending event: only the holder publishes, so each
        event goes out once unless its publisher dies between publishing and clearing.
        """
        now = time.time() if now is None else now
        try:
            resp = self.call(
                "update_item",
                Key=item({"pk": run_id, "sk": RUN_SK}),
                UpdateExpression="SET outbox.claimed_until = :until",
                ConditionExpression="attribute_exists(outbox.detail_type) AND "
                "(attribute_not_exists(outbox.claimed_until) OR outbox.claimed_until < :now)",
                ExpressionAttributeValues=item({":until": int(now + lease_s), ":now": int(now)}),
                # The event as the item holds it at the claim, not as the caller last read it. A
                # return value costs no read capacity (DynamoDB UpdateItem API reference).
                ReturnValues="ALL_NEW",
            )
        except ClientError:
            return None
        return OutboxEvent.model_validate(values(resp["Attributes"])["outbox"])

    def release_outbox(self, run_id: str, detail_type: str) -> None:
        """Give up the claim after a failed publish, so the next delivery publishes at once."""
        self._remove_from_outbox(run_id, detail_type, "outbox.claimed_until")

    def clear_outbox(self, run_id: str, detail_type: str) -> None:
        """Forget the published event (only if the outbox still holds that one)."""
        self._remove_from_outbox(run_id, detail_type, "outbox")

    def _remove_from_outbox(self, run_id: str, detail_type: str, path: str) -> None:
        with contextlib.suppress(ClientError):
            self.call(
                "update_item",
                Key=item({"pk": run_id, "sk": RUN_SK}),
                UpdateExpression=f"REMOVE {path}",
                ConditionExpression="outbox.detail_type = :dt",
                ExpressionAttributeValues=item({":dt": detail_type}),
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
            resp = self.call(
                "update_item",
                Key=item({"pk": run_id, "sk": RUN_SK}),
                UpdateExpression="SET #s = :fin, finalize_from = #s, lease_until = :lease, updated_at = :now",
                ConditionExpression=f"#s IN ({', '.join(active)}) OR (#s = :fin AND lease_until < :now)",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues=item(
                    {**active, ":fin": RunStatus.FINALIZING, ":lease": int(now + lease_s), ":now": int(now)}
                ),
                ReturnValues="ALL_NEW",
            )
        except ClientError:
            return None
        return RunItem.model_validate(values(resp["Attributes"]))

    def leave_finalizing(
        self, run_id: str, status: RunStatus, fields: dict[str, Any], outbox: EventDetail | None = None
    ) -> None:
        """FINALIZING -> SUCCEEDED | FAILED (the outcome) or RETRYING (a retry pass), with the given fields."""
        self._update(run_id, {**fields, "status": status}, expect=RunStatus.FINALIZING, outbox=outbox)

    def release_finalize(self, run_id: str, previous: RunStatus) -> None:
        """FINALIZING -> previous status after a transient error (the retried event finalizes)."""
        with contextlib.suppress(ClientError):
            self._update(run_id, {"status": previous}, expect=RunStatus.FINALIZING)

    def lease_prepared(self, run_id: str, *, lease_s: int = 300, now: float | None = None) -> bool:
        """Take the PREPARING run's submit step (a lease): False when another invocation holds it."""
        now = time.time() if now is None else now
        try:
            self.call(
                "update_item",
                Key=item({"pk": run_id, "sk": RUN_SK}),
                UpdateExpression="SET lease_until = :until, updated_at = :now",
                ConditionExpression="#s = :prep AND (attribute_not_exists(lease_until) OR lease_until < :now)",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues=item(
                    {":prep": RunStatus.PREPARING, ":until": int(now) + lease_s, ":now": int(now)}
                ),
            )
        except ClientError:  # only a lost condition stays a ClientError (Table.call)
            return False
        return True

    def release_prepared(self, run_id: str) -> None:
        """Give the submit step's lease back after a transient error (the retry takes it again)."""
        with contextlib.suppress(ClientError):
            self.call(
                "update_item",
                Key=item({"pk": run_id, "sk": RUN_SK}),
                UpdateExpression="REMOVE lease_until",
                ConditionExpression="#s = :prep",
                ExpressionAttributeNames={"#s": "status"},
                ExpressionAttributeValues=item({":prep": RunStatus.PREPARING}),
            )

    def recent_runs(self, limit: int = 20, *, since: int = 0) -> list[RunItem]:
        """Newest runs first (gsi1: gsi1pk = RUNS, sorted by created_at), created at or after `since`."""
        out: list[RunItem] = []
        kwargs: dict[str, Any] = {
            "IndexName": "gsi1",
            "KeyConditionExpression": "gsi1pk = :p AND created_at >= :since",
            "ExpressionAttributeValues": item({":p": LIST_PK, ":since": since}),
            "ScanIndexForward": False,
        }
        while len(out) < limit:
            resp = self.call("query", Limit=min(100, limit - len(out)), **kwargs)
            out += [RunItem.model_validate(values(i)) for i in resp.get("Items", [])]
            if "LastEvaluatedKey" not in resp:
                break
            kwargs["ExclusiveStartKey"] = resp["LastEvaluatedKey"]
        return out
