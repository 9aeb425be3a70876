"""Prometheus remote-write 1.0 to Amazon Managed Service for Prometheus (or any receiver).

AMP's SDKs have no remote-write call, so this is ours: a registry's samples become a
WriteRequest (gpu_worker.telemetry.write_request), SigV4-signed for service `aps` when the URL is an
AMP workspace, and POSTed by a background thread at start, every PushPolicy.interval_s, and
once more at exit, followed by staleness markers so the rank's series end when it does.
429/5xx are retried with backoff (429's Retry-After honoured); other 4xx (e.g. out-of-order
samples) drop that batch and count it. Every push has a deadline, and `stop()` takes at most
PushPolicy.shutdown_s. Nothing here ever raises into inference.
"""

from __future__ import annotations

import email.utils
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gpu_worker.log import child
from gpu_worker.telemetry.write_request import Series, encode_write_request, registry_series, snappy_block
from sluice.aws.sigv4 import normalize, region_of, sign_aps

log = child("remote_write")

HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
    "User-Agent": "sluice-worker",
}
DROPPED = "sluice_remote_write_dropped_samples_total"
Signer = Callable[[str, str, bytes | None, Mapping[str, str], str], dict[str, str]]


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds a Retry-After header asks for (delta-seconds or an HTTP date); None when absent or unreadable."""
    v = (value or "").strip()
    if not v:
        return None
    if v.isdigit():
        return float(v)
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


@dataclass
class PushResult:
    status: str  # sent | dropped | failed | empty
    samples: int
    bytes: int
    http_status: int | None = None


class _Drops(Collector):
    """The writer's own drop counter, with its rank's identity labels like every other series."""

    def __init__(self, writer: RemoteWriter, labels: Mapping[str, str]) -> None:
        self._writer = writer
        self._labels = {k: str(v) for k, v in labels.items() if str(v)}

    def collect(self) -> Iterator[Metric]:
        fam = CounterMetricFamily(
            DROPPED,
            "Samples the remote-write receiver refused (4xx) or that outlived every retry.",
            labels=list(self._labels),
        )
        fam.add_metric(list(self._labels.values()), self._writer.dropped_samples)
        yield fam


@dataclass(frozen=True)
class PushPolicy:
    """What a RemoteWriter pushes, how often, and how hard it tries (defaults: docs/metrics.md)."""

    interval_s: float = 30.0  # between pushes (SLUICE_WORKER_PUSH_INTERVAL_S)
    keep: Sequence[str] | None = None  # the families pushed (metrics.keep_list); None: all
    timeout_s: float = 10.0  # one POST
    max_attempts: int = 5  # POSTs of one push (429 and 5xx are retried)
    backoff_s: float = 0.5  # base of the jittered exponential backoff between them
    shutdown_s: float = 5.0  # the most stop() takes: the last push and the staleness markers
    max_retry_after_s: float = 60.0  # a longer Retry-After is cut to this


class RemoteWriter:
    """Pushes a registry to a remote-write URL from a daemon thread; never raises into its caller.

    `labels` is the rank's identity (run_id, rank, ...): the writer's own drop counter carries
    it, so concurrent ranks never write the same series. `region` (default: the AMP URL's)
    makes it SigV4-sign each POST with `sign`; a URL that is no AMP workspace is not signed.
    """

    def __init__(
        self,
        url: str,
        registry: CollectorRegistry,
        *,
        labels: Mapping[str, str],
        policy: PushPolicy | None = None,
        region: str | None = None,
        sign: Signer = sign_aps,
    ) -> None:
        self.url = normalize(url)
        self.registry = registry
        self.policy = policy or PushPolicy()
        self._region = region or region_of(self.url)
        self._sign = sign
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._last_ts = 0
        self._last_series: list[Series] = []
        self.dropped_samples = 0.0
        self.outcomes: Counter[str] = Counter()
        self.last: PushResult | None = None
        registry.register(_Drops(self, labels))

    @property
    def pushes(self) -> int:
        return sum(self.outcomes.values())

    def _next_ts(self) -> int:
        self._last_ts = max(int(time.time() * 1000), self._last_ts + 1)  # strictly increasing per series
        return self._last_ts

    def push_once(self, deadline: float | None = None) -> PushResult:
        """Encode, compress, sign and send the current values (with retries, until `deadline`)."""
        with self._lock:  # the exit flush and the timer never interleave
            return self._push(self._deadline() if deadline is None else deadline)

    def _deadline(self) -> float:
        """When a periodic push gives up: an interval (or one POST's timeout, if longer) from now."""
        return time.monotonic() + max(self.policy.interval_s, self.policy.timeout_s)

    def _push(self, deadline: float, cancel: threading.Event | None = None) -> PushResult:
        series = registry_series(self.registry, self.policy.keep)
        if not series:
            return PushResult("empty", 0, 0)
        body = snappy_block(encode_write_request(series, self._next_ts()))
        result = self._send(body, len(series), deadline, cancel)
        if result.status == "sent":
            self._last_series = series
        else:
            self.dropped_samples += len(series)
        self.outcomes[result.status] += 1
        self.last = result
        return result

    def _send(self, body: bytes, n: int, deadline: float, cancel: threading.Event | None = None) -> PushResult:
        status: int | None = None
        for attempt in range(1, self.policy.max_attempts + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            wait_at_least = 0.0
            try:
                headers = dict(HEADERS)
                if self._region:
                    headers = self._sign("POST", self.url, body, headers, self._region)
                req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")  # noqa: S310
                with urllib.request.urlopen(req, timeout=min(self.policy.timeout_s, left)) as resp:  # noqa: S310
                    return PushResult("sent", n, len(body), resp.status)
            except urllib.error.HTTPError as exc:
                status = exc.code
                detail = exc.read()[:200].decode(errors="replace")
                if exc.code != 429 and exc.code < 500:
                    log.warning("remote write refused (HTTP %s): dropping %d samples: %s", exc.code, n, detail)
                    return PushResult("dropped", n, len(body), exc.code)
                wait_at_least = min(self.policy.max_retry_after_s, retry_after_s(exc.headers.get("Retry-After")) or 0.0)
                log.warning("remote write attempt %d: HTTP %s %s", attempt, exc.code, detail)
            except Exception as exc:
                log.warning("remote write attempt %d failed: %s", attempt, exc)
            delay = max(wait_at_least, random.uniform(0, self.policy.backoff_s * 2 ** (attempt - 1)))
            if attempt == self.policy.max_attempts or delay >= deadline - time.monotonic():
                break  # the receiver's wait does not fit: the next push carries the same cumulative counts
            if (cancel or threading.Event()).wait(delay):
                break
        log.warning("remote write gave up (HTTP %s): dropping %d samples", status, n)
        return PushResult("failed", n, len(body), status)

    def _loop(self) -> None:
        # The first push is at once: the series start with the rank (counters at 0), so a job
        # shorter than one interval still shows its rate and a rank that dies early is seen.
        while True:
            try:
                with self._lock:
                    self._push(self._deadline(), cancel=self._stop)
            except Exception:
                log.exception("remote write push failed")
            if self._stop.wait(self.policy.interval_s):
                return

    def start(self) -> RemoteWriter:
        """Start the background pusher."""
        self._thread = threading.Thread(target=self._loop, name="remote-write", daemon=True)
        self._thread.start()
        return self

    def stop(self, flush: bool = True) -> PushResult | None:
        """Stop the thread, push once more and end the series; all within `shutdown_s`."""
        deadline = time.monotonic() + self.policy.shutdown_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if not flush:
            return None
        # A push still waiting on a hanging receiver holds the lock: do not wait past the deadline.
        if not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            log.warning("final remote write skipped: a push is still waiting for the receiver")
            return None
        try:
            result = self._push(deadline)
            if result.status == "sent":
                self._end_series(deadline)
            return result
        except Exception:
            log.exception("final remote write failed")
            return None
        finally:
            self._lock.release()

    def _end_series(self, deadline: float) -> None:
        """Staleness markers for what was last sent, so queries stop seeing a finished rank at once."""
        body = snappy_block(encode_write_request(self._last_series, self._next_ts(), stale=True))
        res = self._send(body, len(self._last_series), deadline)
        if res.status != "sent":
            log.info("staleness markers not sent (%s): the series end after the lookback window", res.status)
