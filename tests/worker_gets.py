"""A worker test's images on in-process moto S3, and the GETs the worker makes there.

The worker builds its Fetcher where it GETs (each loader, the parts pass), over the process's data
client (gpu_worker.sources.clients.data_client: one per tuning). Gets hooks that client (botocore's
before-parameter-build event) to record each GetObject and, on demand, answer it as S3 does under
load (503 SlowDown), hold it (a slow object), or stop the worker (its credentials gone).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from botocore.exceptions import ClientError, PartialCredentialsError

from gpu_worker.config import WorkerConfig
from gpu_worker.sources.clients import data_client
from tests.conftest import moto_s3

GUARD = 30  # seconds a held GET waits at most: a broken pipeline fails instead of hanging
GET_EVENT = "before-parameter-build.s3.GetObject"


def moto_objects(bucket: str, objects: Mapping[str, bytes]) -> Iterator[Any]:
    """In-process moto S3 (tests.conftest.moto_s3) whose `bucket` holds the objects: a fixture's body."""
    for s3 in moto_s3(bucket):
        for key, data in objects.items():
            s3.put_object(Bucket=bucket, Key=key, Body=data)
        yield s3


class Gets:
    """The data client's GetObject calls while in a `with` block: `keys` and `times` (epoch s) in call order.

    crash_after: later GETs find the credentials gone (the worker fails the attempt: "simulated crash").
    gates: a key's GET waits until its event is set. slow_down(key, n): whether the key's n-th GET
    (from 1) is answered 503 SlowDown.
    """

    def __init__(
        self,
        cfg: WorkerConfig,
        *,
        crash_after: int | None = None,
        gates: Mapping[str, threading.Event] | None = None,
        slow_down: Callable[[str, int], bool] | None = None,
    ) -> None:
        self._events = data_client(cfg).meta.events
        self.crash_after, self.gates, self.slow_down = crash_after, gates or {}, slow_down
        self.keys: list[str] = []
        self.times: list[float] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Gets:
        self._events.register(GET_EVENT, self._hook)
        return self

    def __exit__(self, *exc: object) -> None:
        self._events.unregister(GET_EVENT, self._hook)

    @property
    def calls(self) -> int:
        return len(self.keys)

    def count(self, key: str) -> int:
        return self.keys.count(key)

    def _hook(self, params: dict[str, Any], **_: Any) -> None:
        key = params["Key"]
        with self._lock:
            self.keys.append(key)
            self.times.append(time.time())
            n, nth = len(self.keys), self.keys.count(key)
        if self.crash_after is not None and n > self.crash_after:
            raise PartialCredentialsError(provider="simulated crash", cred_var="aws_secret_access_key")
        if key in self.gates:
            assert self.gates[key].wait(GUARD)
        if self.slow_down is not None and self.slow_down(key, nth):
            error = {"Code": "SlowDown", "Message": "Please reduce your request rate."}
            raise ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject")
