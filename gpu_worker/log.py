"""Structured JSON log lines on stderr, in the Lambdas' schema (Powertools), carrying the worker's labels.

Every line has `timestamp`, `level`, `message`, `location` and `service` ("sluice-worker"),
the labels set with `set_labels` (run, shard, node, attempt, rank ...) and the call's extra
keys, like sluice.log's lines: one CloudWatch Logs Insights query reads both.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from aws_lambda_powertools import Logger

SERVICE = "sluice-worker"

logger = Logger(service=SERVICE, logger_handler=logging.StreamHandler(sys.stderr))


def child(name: str) -> logging.Logger:
    """A module's logger: its records go out through `logger`'s handler, in the same schema."""
    return logging.getLogger(f"{SERVICE}.{name}")


def setup(level: str = "INFO", **labels: Any) -> Logger:
    """Set the level (once per process is enough); labels go on every line."""
    set_labels(**labels)
    logger.setLevel(level.upper())
    return logger


def set_labels(**labels: Any) -> None:
    logger.append_keys(**{k: v for k, v in labels.items() if v is not None})
