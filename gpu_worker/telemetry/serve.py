"""A rank's metrics at work: served on /metrics and pushed to AMP by the remote writer; `stop()` flushes.

`stop()` leaves nothing running that reaches the rank: the server's thread is joined and the
collector keeps its last readings instead of the rank's live objects. A server thread left
running held the registry, so the collector, so the rank's pass and its torch models; when
that thread let go of them they were freed on it, racing the rank's exit. A torch tensor's
dealloc releases the GIL, and a daemon thread that takes the GIL back while the interpreter
finalizes is ended with pthread_exit, whose unwinding through that C++ frame calls
std::terminate: "terminate called without an active exception", and a rank that had
committed all its work exited with SIGABRT.
"""

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
        self._collector = collector
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.writer: Any = None
        if port:
            try:
                from prometheus_client import start_http_server

                self._server, self._thread = start_http_server(port, registry=self.registry)
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
        """Push once more (a short job's last samples) within the writer's shutdown bound, stop serving.

        Returns once the server's thread has ended (within serve_forever's 0.5 s poll). A scrape
        still answering, or a push stuck past the writer's bound, then reads only the collector's
        last values: no thread of the metrics holds the rank's pass (see the module docstring).
        """
        if self.writer is not None:
            res = self.writer.stop(flush=True)
            log.info("final remote write: %s", res)
        if self._server is not None:
            self._server.shutdown()  # returns once serve_forever has returned
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._collector.freeze()
