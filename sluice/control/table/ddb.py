"""DynamoDB plumbing shared by the runs table's two views (sluice.control.table.ledger, sluice.control.table.records).

One place serialises values, translates errors (sluice.aws.errors) and retries a cancelled
transaction in the process: TransactWriteItems fails as a whole on TransactionConflict
(another transaction on one of its items) or throttling, and botocore does not retry
TransactionCanceledException, so a burst of events on one run would otherwise lose counts
to the Lambda's own, much slower, retry.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from enum import Enum
from typing import TYPE_CHECKING, Any, cast

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel

from sluice.aws.errors import AwsFailure, AwsFatalError, Kind, classify, translate
from sluice.errors import RetriableError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_dynamodb.type_defs import TransactGetItemTypeDef, TransactWriteItemTypeDef

_ser, _de = TypeSerializer(), TypeDeserializer()
TRANSACT_GET_MAX = 100  # items in one TransactGetItems (DynamoDB service quotas)
TRANSACT_TRIES = 8  # first try included; then RetriableError (the invocation is retried)
BACKOFF_BASE_S, BACKOFF_MAX_S = 0.02, 1.0  # full jitter: sleep U(0, min(max, base * 2**i))
STATS: Counter[str] = Counter()  # transactions retried in this process (bench/completion_scale.py)
_stats_lock = threading.Lock()


def plain(v: Any) -> Any:
    """Enums, models and tuples as the plain values DynamoDB's serializer takes."""
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, BaseModel):
        return v.model_dump(mode="json", exclude_none=True)
    if isinstance(v, list | tuple):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(plain(k)): plain(x) for k, x in v.items()}
    return v


def item(values: dict[str, Any]) -> dict[str, Any]:
    """A DynamoDB item (or key, or value map) from plain values; None values are left out."""
    return {k: _ser.serialize(plain(v)) for k, v in values.items() if v is not None}


def value(v: Any) -> dict[str, Any]:
    return dict(_ser.serialize(plain(v)))


def values(raw: dict[str, Any]) -> dict[str, Any]:
    """A DynamoDB item as plain Python values."""
    return {k: _de.deserialize(v) for k, v in raw.items()}


def prefixed(dynamodb: Any, table: str, pk: str, prefix: str) -> list[dict[str, Any]]:
    """One partition's items whose sort key starts with prefix, as plain values (one consistent page)."""
    resp = dynamodb.query(
        TableName=table,
        KeyConditionExpression="pk = :pk AND begins_with(sk, :p)",
        ExpressionAttributeValues={":pk": {"S": pk}, ":p": {"S": prefix}},
        ConsistentRead=True,
    )
    return [values(i) for i in resp.get("Items", [])]


def set_clause(fields: dict[str, Any], tag: str = "") -> tuple[str, dict[str, str], dict[str, Any]]:
    """'#0 = :0, #1 = :1', its attribute names and its serialized values."""
    names = {f"#{tag}{i}": k for i, k in enumerate(fields)}
    vals = {f":{tag}{i}": value(v) for i, v in enumerate(fields.values())}
    return ", ".join(f"#{tag}{i} = :{tag}{i}" for i in range(len(fields))), names, vals


def _count(what: str) -> None:
    with _stats_lock:
        STATS[what] += 1


class Table:
    """One DynamoDB table behind an injected (or lazily created) boto3 client."""

    def __init__(self, client: DynamoDBClient, table: str) -> None:
        self._client = client
        self._table = table

    @property
    def table(self) -> str:
        return self._table

    @property
    def client(self) -> DynamoDBClient:
        return self._client

    def call(self, op: str, **kwargs: Any) -> Any:
        """One DynamoDB call; a lost condition stays a ClientError, anything else is translated once.

        A write to an item another transaction holds fails with TransactionConflictException
        (nothing written; botocore does not retry it): retried here, as a cancelled transaction is,
        so a decision already taken (FINALIZING -> SUCCEEDED) is not dropped for the event's retry.
        """
        for i in range(TRANSACT_TRIES):
            try:
                return getattr(self._client, op)(TableName=self._table, **kwargs)
            except (ClientError, BotoCoreError) as exc:
                if classify(exc).kind is Kind.CONDITION:
                    raise
                if not (_in_conflict(exc) and i < TRANSACT_TRIES - 1):
                    raise translate(exc, f"DynamoDB {op} on table {self._table!r}") from exc
            _count("writes_retried")
            _backoff(i)
        raise AssertionError("unreachable: the last try returns or raises")

    def transact(self, items: list[dict[str, Any]]) -> bool:
        """TransactWriteItems, retried in the process while cancelled for a transient reason.

        False when a condition failed (a duplicate or stale write); RetriableError when the
        conflicts outlast TRANSACT_TRIES; AwsFatalError when AWS will never accept it.
        """
        for it in items:
            next(iter(it.values()))["TableName"] = self._table
        for i in range(TRANSACT_TRIES):
            transient = self._transact_once(items)
            if transient is None:
                return True
            if transient is False:
                return False
            if i < TRANSACT_TRIES - 1:
                _count("transactions_retried")
                _backoff(i)
        _count("transactions_given_up")
        raise RetriableError(
            f"DynamoDB transaction on table {self._table!r} still cancelled ({transient}) after "
            f"{TRANSACT_TRIES} tries; will retry"
        )

    def transact_get(self, keys: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
        """TransactGetItems: the items of keys (None where absent) as one serializable snapshot.

        DynamoDB's isolation levels: TransactGetItems is serializable against every transaction,
        while BatchGetItem is only read-committed per item, so a batch read beside a concurrent
        TransactWriteItems may see some items before it and some after, a sum that never existed.
        A get is cancelled (TransactionConflict) while a write transaction holds one of the items:
        retried here like a cancelled write. At most 100 items a call (DynamoDB quotas).
        """
        if len(keys) > TRANSACT_GET_MAX:
            raise ValueError(f"TransactGetItems reads at most {TRANSACT_GET_MAX} items, not {len(keys)}")
        request = [{"Get": {"TableName": self._table, "Key": k}} for k in keys]
        for i in range(TRANSACT_TRIES):
            try:
                resp = self._client.transact_get_items(TransactItems=cast("list[TransactGetItemTypeDef]", request))
                return [values(r["Item"]) if r.get("Item") else None for r in resp.get("Responses", [])]
            except (ClientError, BotoCoreError) as exc:
                if not (_get_cancelled(exc) and i < TRANSACT_TRIES - 1):
                    if _get_cancelled(exc):
                        _count("reads_given_up")
                        raise RetriableError(
                            f"DynamoDB TransactGetItems on table {self._table!r} still cancelled after "
                            f"{TRANSACT_TRIES} tries; will retry"
                        ) from exc
                    raise translate(exc, f"DynamoDB TransactGetItems on table {self._table!r}") from exc
            _count("reads_retried")
            _backoff(i)
        raise AssertionError("unreachable: the last try returns or raises")

    def _transact_once(self, items: list[dict[str, Any]]) -> str | bool | None:
        """None: written; False: a condition failed; a string: the transient reasons (try again)."""
        try:
            self._client.transact_write_items(TransactItems=cast("list[TransactWriteItemTypeDef]", items))
            return None
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                failure = classify(exc)
                if failure.retriable:
                    return failure.code
                raise translate(exc, f"DynamoDB TransactWriteItems on table {self._table!r}") from exc
            reasons = [str(r.get("Code") or "None") for r in exc.response.get("CancellationReasons", [])]
            transient = [r for r in reasons if r != "None" and classify(_cancelled(r)).retriable]
            if transient:
                return ", ".join(transient)
            if "ConditionalCheckFailed" in reasons:
                return False
            message = f"DynamoDB transaction on table {self._table!r} cancelled: {reasons}"
            failure = AwsFailure(Kind.INVALID, "TransactionCanceledException", 400, message)
            raise AwsFatalError(f"{message}; check the items' keys and types (sluice.contracts)", failure) from exc
        except BotoCoreError as exc:
            failure = classify(exc)
            if failure.retriable:
                return failure.code
            raise translate(exc, f"DynamoDB TransactWriteItems on table {self._table!r}") from exc


def _backoff(i: int) -> None:
    """Full jitter before try i + 2: sleep U(0, min(max, base * 2**i))."""
    time.sleep(random.uniform(0, min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2**i)))


def _in_conflict(exc: ClientError | BotoCoreError) -> bool:
    return isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == "TransactionConflictException"


def _get_cancelled(exc: ClientError | BotoCoreError) -> bool:
    """A TransactGetItems cancelled for a transient reason (a write transaction in flight, throttling)."""
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code")
        if code == "TransactionCanceledException":
            reasons = [str(r.get("Code") or "None") for r in exc.response.get("CancellationReasons", [])]
            return all(r == "None" or classify(_cancelled(r)).retriable for r in reasons)
        return code == "TransactionConflictException" or classify(exc).retriable
    return classify(exc).retriable


def _cancelled(code: str) -> ClientError:
    """A TransactWriteItems cancellation reason as a ClientError, so the one classification applies."""
    return ClientError({"Error": {"Code": code, "Message": ""}}, "TransactWriteItems")
