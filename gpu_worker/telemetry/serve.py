"""A rank's metrics at work: served on /metrics and pushed to AMP by the remote writer; `stop()` flushes."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from gpu_worker.log import child
from gpu_worker.telemetry.collector import RankCollector, rank_registry, series_count
from gpu_worker.telemetry.families import CRITICAL

if TYPE_CHECKING:
    from gpu_worker.telemetry.remote_write import PushPolicy

log = child("metrics")


class RankMetrics:
    """A rank's registry, its /metrics endpoint and its remote writer; `stop()` flushes."""

    def __init__(
        self, collector: RankCollector, *, port: int = 0, remote_write_url: str = "", push: PushPolicy | None = None
    ) -> None:
        """`port`: serve /metrics there (0: not at all); `remote_write_url`: push there as `push` says."""
        self.registry = rank_registry(collector)
        self._server: Any = None
        self.writer: Any = None
        if port:
            try:
                from prometheus_client import start_http_server

                self._server, _ = start_http_server(port, registry=self.registry)
                log.info("serving /metrics on port %d", port)
            except OSError as exc:  # a busy port must never stop inference
                log.warning("cannot serve /metrics on port %d: %s", port, exc)
        if remote_write_url:
            from gpu_worker.telemetry.remote_write import PushPolicy, RemoteWriter

            self.writer = RemoteWriter(
                remote_write_url, self.registry, labels=collector.labels, policy=push or PushPolicy(keep=CRITICAL)
            ).start()

    def series(self) -> int:
        return series_count(self.registry)

    def stop(self) -> None:
        """Push once more (a short job's last samples) within the writer's shutdown bound, stop serving."""
        if self.writer is not None:
            res = self.writer.stop(flush=True)
            log.info("final remote write: %s", res)
        if self._server is not None:
            # shutdown() waits for serve_forever's 0.5 s poll; the rank is exiting, so do not wait.
            threading.Thread(target=self._server.shutdown, daemon=True).start()
            self._server = None
