"""moto's S3 server plus a fault-injection layer, for worker tests and bench/worker.py.

    python -m tests.worker_s3server --port 5000

Same app as `python -m moto.server`, wrapped in a WSGI middleware that, per GET, can add
latency and answer 503 SlowDown (a rate, or the first N GETs of a key, or always). The
faults are configured and counted through the extra endpoint /_faults (GET: counters and
config as JSON; POST: replace config). Latency is injected with time.sleep in the server's
request thread: it costs no CPU, like a real network round trip.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>fault</RequestId></Error>"
)
DEFAULTS: dict[str, Any] = {
    "latency_ms": 0.0,  # added to every object GET under latency_prefix
    "latency_prefix": "/",
    "slowdown_rate": 0.0,  # fraction of GETs under slowdown_prefix answered 503 SlowDown
    "slowdown_prefix": "/",
    "fail_first": {},  # "/bucket/key" -> answer the first N GETs of that key with 503
    "always_fail": [],  # "/bucket/key" answered 503 forever
    "seed": 0,
}


class FaultMiddleware:
    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._configure({})

    def _configure(self, cfg: dict[str, Any]) -> None:
        with self._lock:
            self.cfg = {**DEFAULTS, **cfg}
            self._rng = random.Random(self.cfg["seed"])
            self.counts: dict[str, Any] = {"gets": 0, "injected": 0, "delayed": 0, "per_key": {}}

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/_faults":
            if environ["REQUEST_METHOD"] == "POST":
                size = int(environ.get("CONTENT_LENGTH") or 0)
                self._configure(json.loads(environ["wsgi.input"].read(size) or b"{}"))
            with self._lock:
                body = json.dumps({"config": self.cfg, "counts": self.counts}).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if environ["REQUEST_METHOD"] == "GET":
            inject, delay = self._decide(path)
            if delay:
                time.sleep(delay)
            if inject:
                start_response(
                    "503 Slow Down", [("Content-Type", "application/xml"), ("Content-Length", str(len(SLOWDOWN)))]
                )
                return [SLOWDOWN]
        return self._app(environ, start_response)

    def _decide(self, path: str) -> tuple[bool, float]:
        with self._lock:
            c = self.cfg
            self.counts["gets"] += 1
            is_object = path.count("/") >= 2 and not path.endswith("/")
            n = self.counts["per_key"].get(path, 0) + 1
            if is_object:
                self.counts["per_key"][path] = n
            delay = c["latency_ms"] / 1000.0 if is_object and path.startswith(c["latency_prefix"]) else 0.0
            if delay:
                self.counts["delayed"] += 1
            inject = (
                path in c["always_fail"]
                or n <= int(c["fail_first"].get(path, 0))
                or (path.startswith(c["slowdown_prefix"]) and self._rng.random() < c["slowdown_rate"])
            )
            if inject:
                self.counts["injected"] += 1
            return inject, delay


def main(argv: list[str] | None = None) -> None:
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import run_simple

    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args(argv)
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(args.host, args.port, FaultMiddleware(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
