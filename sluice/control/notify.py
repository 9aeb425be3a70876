"""EventBridge adapter: publishes run events (source "sluice") on the sluice bus."""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from sluice.aws.errors import translate
from sluice.contracts.events import EventDetail
from sluice.errors import RetriableError

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_events.type_defs import PutEventsRequestEntryTypeDef

SOURCE = "sluice"


class EventPublisher:
    """put_events wrapper; a failed entry is retriable (the caller's invocation is retried)."""

    def __init__(self, client: EventBridgeClient, bus: str) -> None:
        self._client = client
        self._bus = bus

    def publish(self, detail: EventDetail) -> str:
        """Publish one event (detail-type from the model); returns the detail-type.

        Raises RetriableError when EventBridge did not take it, AwsFatalError when it never will
        (a missing bus, a missing permission).
        """
        detail_type = detail.detail_type
        entry: PutEventsRequestEntryTypeDef = {
            "Source": SOURCE,
            "DetailType": detail_type,
            "Detail": detail.model_dump_json(),
            "EventBusName": self._bus,
        }
        try:
            resp = self._client.put_events(Entries=[entry])
        except (ClientError, BotoCoreError) as exc:
            raise translate(exc, f"EventBridge PutEvents on bus {self._bus!r}") from exc
        if resp.get("FailedEntryCount"):
            err = resp["Entries"][0]
            raise RetriableError(
                f"EventBridge refused {detail_type!r}: {err.get('ErrorCode')} {err.get('ErrorMessage')}"
            )
        return detail_type
