"""Prometheus remote-write 1.0 to Amazon Managed Service for Prometheus (or any receiver).

AMP's SDKs have no remote-write call, so this is ours: the registry's samples become a
WriteRequest protobuf (hand-encoded: labels sorted, `__name__` included, histograms as their
_bucket/_sum/_count series), compressed with raw (block) snappy, SigV4-signed for service
`aps` when the URL is an AMP workspace, and POSTed by a background thread every
`interval_s` and once more at exit. 429/5xx are retried with backoff; other 4xx (e.g.
out-of-order samples) drop that batch and count it. Nothing here ever raises into inference.
"""

from __future__ import annotations

import random
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from gpu_worker.log import child
from sluice.sigv4 import region_of, sign_aps

log = child("remote_write")

HEADERS = {
    "Content-Encoding": "snappy",
    "Content-Type": "application/x-protobuf",
    "X-Prometheus-Remote-Write-Version": "0.1.0",
    "User-Agent": "sluice-worker",
}
Series = tuple[tuple[tuple[str, str], ...], float]  # (sorted labels incl. __name__, value)


# ---- protobuf (prometheus/prompb/remote.proto, types.proto) ---------------------------------


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negatives
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def encode_write_request(series: Iterable[Series], timestamp_ms: int) -> bytes:
    """WriteRequest{timeseries: [TimeSeries{labels, samples: [Sample{value, timestamp}]}]}."""
    ts_tag = _varint(2 << 3 | 0)
    out = bytearray()
    for labels, value in series:
        body = bytearray()
        for name, val in labels:
            body += _field(1, _field(1, name.encode()) + _field(2, val.encode()))
        sample = b"\x09" + struct.pack("<d", value) + ts_tag + _varint(timestamp_ms)  # 0x09: field 1, fixed64
        body += _field(2, sample)
        out += _field(1, bytes(body))
    return bytes(out)


def registry_series(
    registry: CollectorRegistry, keep: Sequence[str] | None = None, extra: dict[str, str] | None = None
) -> list[Series]:
    """Every sample of the registry as a series; `keep` lists the metric families to include."""
    wanted = set(keep) if keep is not None else None
    out: list[Series] = []
    for family in registry.collect():
        # prometheus_client names a counter family without "_total"; accept either spelling.
        if wanted is not None and family.name not in wanted and f"{family.name}_total" not in wanted:
            continue
        for s in family.samples:
            if s.name.endswith("_created"):
                continue  # prometheus_client's creation timestamps: not worth a series each
            labels = {**(extra or {}), **s.labels, "__name__": s.name}
            out.append((tuple(sorted(labels.items())), float(s.value)))
    return out


# ---- snappy + SigV4 ------------------------------------------------------------------------


def snappy_block(data: bytes) -> bytes:
    """Raw (block) snappy, as remote write requires (not the framed format)."""
    import cramjam

    return bytes(cramjam.snappy.compress_raw(data))


def sigv4_headers(url: str, body: bytes, headers: dict[str, str], region: str) -> dict[str, str]:
    """Headers with a SigV4 signature for service `aps` (the container's credentials)."""
    return sign_aps("POST", url, body, headers, region)


# ---- the pusher ----------------------------------------------------------------------------


@dataclass
class PushResult:
    status: str  # sent | dropped | failed | empty
    samples: int
    bytes: int
    http_status: int | None = None


class RemoteWriter:
    """Pushes a registry to a remote-write URL from a daemon thread; never raises into its caller."""

    def __init__(
        self,
        url: str,
        registry: CollectorRegistry,
        *,
        interval_s: float = 30.0,
        keep: Sequence[str] | None = None,
        extra_labels: dict[str, str] | None = None,
        timeout_s: float = 10.0,
        max_attempts: int = 5,
        backoff_s: float = 0.5,
        sign: Callable[[str, bytes, dict[str, str], str], dict[str, str]] = sigv4_headers,
    ) -> None:
        self.url = url
        self.registry = registry
        self.interval_s = interval_s
        self.keep = keep
        self.extra_labels = extra_labels or {}
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self._sign = sign
        self._region = region_of(url)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._last_ts = 0
        self.dropped = Counter(
            "sluice_remote_write_dropped_samples_total",
            "Samples the remote-write receiver refused (4xx) or that outlived every retry.",
            registry=registry,
        )
        self.pushes = 0
        self.last: PushResult | None = None

    def push_once(self) -> PushResult:
        """Encode, compress, sign and send the current values (with retries)."""
        with self._lock:  # the exit flush and the timer never interleave
            series = registry_series(self.registry, self.keep, self.extra_labels)
            if not series:
                return PushResult("empty", 0, 0)
            ts = max(int(time.time() * 1000), self._last_ts + 1)  # strictly increasing per series
            self._last_ts = ts
            body = snappy_block(encode_write_request(series, ts))
            result = self._send(body, len(series))
            if result.status != "sent":
                self.dropped.inc(len(series))
            self.pushes += 1
            self.last = result
            return result

    def _send(self, body: bytes, n: int) -> PushResult:
        status: int | None = None
        for attempt in range(1, self.max_attempts + 1):
            headers = dict(HEADERS)
            try:
                if self._region:
                    headers = self._sign(self.url, body, headers, self._region)
                req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")  # noqa: S310
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
                    return PushResult("sent", n, len(body), resp.status)
            except urllib.error.HTTPError as exc:
                status = exc.code
                if exc.code != 429 and exc.code < 500:
                    log.warning(
                        "remote write refused (HTTP %s): dropping %d samples: %s",
                        exc.code,
                        n,
                        exc.read()[:200].decode(errors="replace"),
                    )
                    return PushResult("dropped", n, len(body), exc.code)
            except Exception as exc:
                log.warning("remote write attempt %d failed: %s", attempt, exc)
            if attempt < self.max_attempts and not self._stop.is_set():
                time.sleep(random.uniform(0, self.backoff_s * 2 ** (attempt - 1)))
        log.warning("remote write gave up after %d attempts: dropping %d samples", self.max_attempts, n)
        return PushResult("failed", n, len(body), status)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.push_once()
            except Exception:
                log.exception("remote write push failed")

    def start(self) -> RemoteWriter:
        """Start the background pusher."""
        self._thread = threading.Thread(target=self._loop, name="remote-write", daemon=True)
        self._thread.start()
        return self

    def stop(self, flush: bool = True) -> PushResult | None:
        """Stop the thread and push once more, so a short job's last samples land."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_s)
        if not flush:
            return None
        self._stop.clear()  # let the final push retry
        try:
            return self.push_once()
        except Exception:
            log.exception("final remote write failed")
            return None
        finally:
            self._stop.set()
