"""boto3 S3 clients, one of each kind per process, created on first use (sluice.aws.clients's cache).

control: plan, shards, markers, output, through control_store() (botocore adaptive mode, many
attempts: losing a marker write fails the attempt). data: image GETs, tuned by WorkerConfig
(pool size, attempts, timeouts); our own retries and the final pass sit on top of it
(gpu_worker.sources.fetch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from botocore.config import Config

from gpu_worker.config import WorkerConfig
from sluice.aws import clients as aws
from sluice.aws.store import ObjectStore

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

CONTROL_CONFIG = Config(
    retries={"total_max_attempts": 10, "mode": "adaptive"},
    max_pool_connections=16,
    connect_timeout=10,
    read_timeout=60,
    user_agent_extra="sluice-worker",
)


def control_client() -> S3Client:
    """Client for the run's own files (plan, shards, commits, output)."""
    return cast("S3Client", aws.client("s3", config=CONTROL_CONFIG, name="worker-control"))


def control_store() -> ObjectStore:
    """The run's own files by URI (S3 or local) over the control client, created on first use."""
    return ObjectStore(connect=control_client)


def data_config(cfg: WorkerConfig) -> Config:
    """The image-GET client's config: a connection per concurrent fetch."""
    return Config(
        retries={"total_max_attempts": cfg.s3_max_attempts, "mode": cfg.s3_retry_mode},
        max_pool_connections=cfg.fetch_concurrency + 2,
        connect_timeout=cfg.connect_timeout_s,
        read_timeout=cfg.read_timeout_s,
        tcp_keepalive=True,
        user_agent_extra="sluice-worker",
    )


def data_client(cfg: WorkerConfig) -> S3Client:
    """Client for image GETs; one per distinct tuning (and endpoint)."""
    name = (
        "worker-data",
        cfg.fetch_concurrency,
        cfg.s3_max_attempts,
        cfg.s3_retry_mode,
        cfg.connect_timeout_s,
        cfg.read_timeout_s,
    )
    client = aws.client("s3", config=data_config(cfg), endpoint_url=cfg.data_endpoint_url or None, name=name)
    return cast("S3Client", client)


def reset() -> None:
    """Forget cached clients (tests that change AWS_ENDPOINT_URL)."""
    aws.reset_clients()
