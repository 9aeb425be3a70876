"""boto3 S3 clients, one of each kind per process, created on first use.

control: plan, shards, markers, output (botocore adaptive mode, many attempts: losing a marker
write fails the attempt). data: image GETs, tuned by WorkerConfig (pool size, attempts,
timeouts); our own retries and the final pass sit on top of it (gpu_worker.fetch).
"""

from __future__ import annotations

import threading
from typing import Any

from botocore.config import Config

from gpu_worker.config import WorkerConfig

_lock = threading.Lock()
_clients: dict[tuple[Any, ...], Any] = {}


def _client(key: tuple[Any, ...], config: Config, endpoint_url: str | None = None) -> Any:
    cached = _clients.get(key)
    if cached is not None:
        return cached
    with _lock:
        if key not in _clients:
            import boto3

            _clients[key] = boto3.session.Session().client("s3", config=config, endpoint_url=endpoint_url)
        return _clients[key]


def control_client() -> Any:
    """Client for the run's own files (plan, shards, commits, output)."""
    cfg = Config(
        retries={"total_max_attempts": 10, "mode": "adaptive"},
        max_pool_connections=16,
        connect_timeout=10,
        read_timeout=60,
        user_agent_extra="sluice-worker",
    )
    return _client(("control",), cfg)


def data_client(cfg: WorkerConfig) -> Any:
    """Client for image GETs: a connection per concurrent fetch."""
    key = (
        "data",
        cfg.fetch_concurrency,
        cfg.s3_max_attempts,
        cfg.s3_retry_mode,
        cfg.connect_timeout_s,
        cfg.read_timeout_s,
        cfg.data_endpoint_url,
    )
    config = Config(
        retries={"total_max_attempts": cfg.s3_max_attempts, "mode": cfg.s3_retry_mode},
        max_pool_connections=cfg.fetch_concurrency + 2,
        connect_timeout=cfg.connect_timeout_s,
        read_timeout=cfg.read_timeout_s,
        tcp_keepalive=True,
        user_agent_extra="sluice-worker",
    )
    return _client(key, config, cfg.data_endpoint_url or None)


def reset() -> None:
    """Forget cached clients (tests that change AWS_ENDPOINT_URL)."""
    with _lock:
        _clients.clear()
