"""A DynamoDB model for concurrent tests: moto made atomic per request, with DynamoDB's isolation levels."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

WRITES = frozenset({"put_item", "update_item", "delete_item"})


class Contended:
    """moto's DynamoDB with the two concurrency behaviours DynamoDB documents.

    Every request is atomic (moto does not serialise conditional writes). A transaction that
    arrives while another one touching one of its items is in flight is cancelled
    (CancellationReasons: TransactionConflict on that item, None on the others); a
    PutItem / UpdateItem / DeleteItem on such an item fails with TransactionConflictException,
    and so does a TransactGetItems (serializable). BatchGetItem is read-committed per item:
    its items are read one at a time, each atomic, the batch not (`between_items` runs after
    each item: a test can land a transaction there). Each transaction holds its items for
    `hold_s`, so concurrent handlers do contend.
    """

    def __init__(self, client: Any, hold_s: float = 0.002, gap_s: float = 0.0005) -> None:
        self._client, self._lock, self._hold, self._gap = client, threading.Lock(), hold_s, gap_s
        self._held: dict[tuple[str, str], int] = {}
        self._meta = threading.Lock()
        self.conflicts = 0
        self.between_items: Callable[[], None] = lambda: time.sleep(self._gap)

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._client, name)
        if not callable(fn):
            return fn
        if name == "transact_write_items":
            return self._transact
        if name == "transact_get_items":
            return self._transact_get
        if name == "batch_get_item":
            return self._batch_get

        def call(*a: Any, **kw: Any) -> Any:
            if name in WRITES and _key(kw) in self._held:  # a write to an item a transaction holds
                self.conflicts += 1
                raise ClientError(
                    {"Error": {"Code": "TransactionConflictException", "Message": "Transaction is ongoing"}}, name
                )
            with self._lock:
                return fn(*a, **kw)

        return call

    def _transact(self, **kw: Any) -> Any:
        keys = [_key(next(iter(op.values()))) for op in kw["TransactItems"]]
        with self._meta:
            busy = [k in self._held for k in keys]
            if any(busy):
                self.conflicts += 1
                reasons = [{"Code": "TransactionConflict" if b else "None"} for b in busy]
                raise _conflict(reasons)
            for k in keys:
                self._held[k] = self._held.get(k, 0) + 1
        try:
            time.sleep(self._hold)  # in flight: others touching these items now conflict
            with self._lock:
                return self._client.transact_write_items(**kw)
        finally:
            with self._meta:
                for k in keys:
                    self._held[k] -= 1
                    if not self._held[k]:
                        del self._held[k]

    def _transact_get(self, **kw: Any) -> Any:
        keys = [_key(op["Get"]) for op in kw["TransactItems"]]
        with self._meta:
            busy = [k in self._held for k in keys]
        if any(busy):  # a write transaction is in flight on one of the items
            self.conflicts += 1
            raise _conflict([{"Code": "TransactionConflict" if b else "None"} for b in busy], "TransactGetItems")
        with self._lock:
            return self._client.transact_get_items(**kw)

    def _batch_get(self, **kw: Any) -> Any:
        out: dict[str, list[Any]] = {}
        for table, spec in kw["RequestItems"].items():
            for key in spec["Keys"]:
                with self._lock:  # this item, atomic; the next one read at another moment
                    consistent = bool(spec.get("ConsistentRead"))
                    got = self._client.get_item(TableName=table, Key=key, ConsistentRead=consistent)
                if "Item" in got:
                    out.setdefault(table, []).append(got["Item"])
                self.between_items()
        return {"Responses": out, "UnprocessedKeys": {}}


def _key(op: dict[str, Any]) -> tuple[str, str]:
    """The item a write names (its Key, or its Item's key attributes)."""
    raw = op.get("Key") or op["Item"]
    return raw["pk"]["S"], raw["sk"]["S"]


def _conflict(reasons: list[dict[str, str]], op: str = "TransactWriteItems") -> ClientError:
    codes = ", ".join(r["Code"] for r in reasons)
    return ClientError(
        {
            "Error": {"Code": "TransactionCanceledException", "Message": f"Transaction cancelled [{codes}]"},
            "CancellationReasons": reasons,
        },
        op,
    )
