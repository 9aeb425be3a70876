"""One S3 GET with failure classification and our retries on top of botocore's.

Transient (429, 5xx, SlowDown, timeouts, dropped connections): botocore retries first
(adaptive mode, `s3_max_attempts`), then we retry `retries` more times with exponential
backoff and full jitter; a key that still fails is deferred (ObjectFailure transient=True)
to the final pass at the end of the loader's stream, which uses longer backoffs.
Everything else is permanent: missing, access_denied, s3_error, too_large. Which errors are
transient is sluice.aws.errors's one classification, shared with the Lambdas.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError, PartialCredentialsError

from gpu_worker.config import WorkerConfig
from gpu_worker.errors import ObjectFailure, WorkerError
from gpu_worker.telemetry.observe import count_retry
from gpu_worker.telemetry.stats import Observer, Stats
from sluice.aws import errors as awserror
from sluice.contracts.status import FailureReason

_REASONS = {
    awserror.Kind.NOT_FOUND: FailureReason.MISSING,
    awserror.Kind.DENIED: FailureReason.ACCESS_DENIED,
    awserror.Kind.TRANSIENT: FailureReason.S3_ERROR_TRANSIENT,
}


def classify(exc: BaseException) -> ObjectFailure:
    """The ObjectFailure an S3 exception means (transient or permanent), by sluice.aws.errors's classification."""
    failure = awserror.classify(exc)
    reason = _REASONS.get(failure.kind, FailureReason.S3_ERROR)
    if isinstance(exc, ClientError):
        detail = f"{failure.code}: {failure.message}".strip()
    else:
        detail = f"{type(exc).__name__}: {exc}"
    return ObjectFailure(reason, detail, transient=failure.retriable)


class ObjectGetter(Protocol):
    """What the Fetcher calls on its client: an S3 client's GetObject (a test may pass its own)."""

    def get_object(self, *, Bucket: str, Key: str) -> Mapping[str, Any]: ...


class Fetched(NamedTuple):
    """An object's bytes and the version they are (output records carry both: sluice.outputs)."""

    data: bytes
    etag: str  # without quotes
    version_id: str | None  # None in an unversioned bucket


ObjMeta = tuple[str, str | None, int]  # (etag, version id, size in bytes) of the object as read


class Fetcher:
    """GETs objects with the data-plane client; thread-safe (boto3 clients are)."""

    def __init__(
        self,
        cfg: WorkerConfig,
        client: ObjectGetter | None = None,
        observer: Observer | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self._cfg = cfg
        self._client = client
        self._obs = observer or Stats()
        self._sleep = sleep
        self._rng = rng or random.Random()

    @property
    def client(self) -> ObjectGetter:
        if self._client is None:
            from gpu_worker.sources.clients import data_client

            self._client = data_client(self._cfg)
        return self._client

    def warm(self) -> None:
        """Create the client now (it is otherwise created by the first GET)."""
        _ = self.client

    def _once(self, bucket: str, key: str) -> Fetched:
        try:
            resp = self.client.get_object(Bucket=bucket, Key=key)
            self._obs.incr("s3_botocore_retries", resp.get("ResponseMetadata", {}).get("RetryAttempts", 0))
            length = int(resp.get("ContentLength", 0) or 0)
            if length > self._cfg.max_object_bytes:
                resp["Body"].close()
                raise ObjectFailure(FailureReason.TOO_LARGE, f"{length} bytes > {self._cfg.max_object_bytes}")
            data = resp["Body"].read()
        except (NoCredentialsError, PartialCredentialsError) as exc:
            raise WorkerError(f"no AWS credentials for S3: {exc}") from exc
        except (ClientError, BotoCoreError, ConnectionError, TimeoutError) as exc:
            raise classify(exc) from None
        except ObjectFailure:
            raise
        except Exception as exc:  # anything else the HTTP stack throws for one object: transient, not fatal
            raise ObjectFailure(
                FailureReason.S3_ERROR_TRANSIENT, f"{type(exc).__name__}: {exc}", transient=True
            ) from None
        self._obs.incr("s3_gets")
        self._obs.incr("s3_bytes", len(data))
        version = resp.get("VersionId")
        return Fetched(bytes(data), str(resp.get("ETag", "")).strip('"'), version if version != "null" else None)

    def get(self, bucket: str, key: str, *, final: bool = False) -> Fetched:
        """The object's bytes and version; ObjectFailure (transient=True when worth a later retry) otherwise."""
        cfg = self._cfg
        tries = cfg.final_retries if final else 1 + cfg.retries
        base = cfg.final_backoff_base_s if final else cfg.backoff_base_s
        started = time.perf_counter()
        try:
            for i in range(tries):
                try:
                    return self._once(bucket, key)
                except ObjectFailure as failure:
                    if not failure.transient or i == tries - 1:
                        raise
                    self._obs.incr("s3_retries")
                    count_retry(self._obs, failure.detail.split(":", 1)[0])
                    self._sleep(self._rng.uniform(0, min(cfg.backoff_max_s, base * 2**i)))
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            self._obs.incr("fetch_seconds", time.perf_counter() - started)
