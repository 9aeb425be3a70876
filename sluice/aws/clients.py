"""Lazy, injectable boto3 clients: one cache per process, shared by the Lambdas, the CLI and the worker."""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, cast

from botocore.config import Config

if TYPE_CHECKING:  # types only (boto3-stubs, a dev dependency): the Lambda artifact needs none of it
    from mypy_boto3_batch import BatchClient
    from mypy_boto3_dynamodb import DynamoDBClient
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_s3 import S3Client

DEFAULT_CONFIG = Config(retries={"max_attempts": 8, "mode": "adaptive"}, user_agent_extra="sluice")
_lock = threading.Lock()
_clients: dict[tuple[Hashable, ...], Any] = {}


def client(
    service: str, *, config: Config | None = None, endpoint_url: str | None = None, name: Hashable = "default"
) -> Any:
    """A cached boto3 client, created on first use so importing sluice needs no AWS.

    Callers that need a differently tuned client (the worker's image GETs) pass their own
    `config` and a `name` that identifies it: one client per (service, name, endpoint).
    """
    key = (service, name, endpoint_url)
    cached = _clients.get(key)
    if cached is not None:
        return cached
    with _lock:
        if key not in _clients:
            import boto3

            session: Any = boto3.session.Session()  # any service by name (the stubs type literal names only)
            _clients[key] = session.client(service, config=config or DEFAULT_CONFIG, endpoint_url=endpoint_url)
        return _clients[key]


def reset_clients() -> None:
    """Forget cached clients (after changing AWS_ENDPOINT_URL or credentials)."""
    with _lock:
        _clients.clear()


class Clients:
    """The clients one unit of work uses; any can be injected (a wrapper, a counting fake), the rest come lazily."""

    def __init__(
        self,
        *,
        s3: S3Client | None = None,
        dynamodb: DynamoDBClient | None = None,
        batch: BatchClient | None = None,
        events: EventBridgeClient | None = None,
        sqs: Any = None,
        iam: Any = None,
    ) -> None:
        self._injected: dict[str, Any] = {
            k: v
            for k, v in {
                "s3": s3,
                "dynamodb": dynamodb,
                "batch": batch,
                "events": events,
                "sqs": sqs,
                "iam": iam,
            }.items()
            if v is not None
        }

    def inject(self, service: str, client: Any) -> Clients:
        """Inject a client for a service the constructor does not name (e.g. "lambda"); returns self."""
        self._injected[service] = client
        return self

    def _get(self, service: str) -> Any:
        return self._injected.get(service) or client(service)

    @property
    def s3(self) -> S3Client:
        return cast("S3Client", self._get("s3"))

    @property
    def dynamodb(self) -> DynamoDBClient:
        return cast("DynamoDBClient", self._get("dynamodb"))

    @property
    def batch(self) -> BatchClient:
        return cast("BatchClient", self._get("batch"))

    @property
    def events(self) -> EventBridgeClient:
        return cast("EventBridgeClient", self._get("events"))

    @property
    def sqs(self) -> Any:
        """Local mode's event queue (moto delivers EventBridge events to SQS targets)."""
        return self._get("sqs")

    @property
    def iam(self) -> Any:
        """Local mode's emulated roles."""
        return self._get("iam")

    @property
    def lambda_(self) -> Any:
        """Lambda: the sweep re-invokes the manifest function for an upload stranded in planning."""
        return self._get("lambda")
