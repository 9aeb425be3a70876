"""EventBridge adapter: publishes run events (source "sluice") on the sluice bus."""

from __future__ import annotations

import json
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel

from sluice.errors import RetriableError

SOURCE = "sluice"


class EventPublisher:
    """put_events wrapper; a failed entry is retriable (the caller's invocation is retried)."""

    def __init__(self, client: Any, bus: str) -> None:
        self._client = client
        self._bus = bus

    def publish(self, detail_type: str, detail: BaseModel | dict[str, Any]) -> None:
        """Publish one event; raises RetriableError when EventBridge did not take it."""
        body = detail.model_dump(mode="json") if isinstance(detail, BaseModel) else detail
        entry = {"Source": SOURCE, "DetailType": detail_type, "Detail": json.dumps(body), "EventBusName": self._bus}
        try:
            resp = self._client.put_events(Entries=[entry])
        except (ClientError, BotoCoreError) as exc:
            raise RetriableError(f"EventBridge put_events on bus {self._bus!r} failed: {exc}") from exc
        if resp.get("FailedEntryCount"):
            err = resp["Entries"][0]
            raise RetriableError(
                f"EventBridge refused {detail_type!r}: {err.get('ErrorCode')} {err.get('ErrorMessage')}"
            )
