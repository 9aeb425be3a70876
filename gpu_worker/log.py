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


def quiet_libraries() -> None:
    """Third-party progress bars and notices (Hugging Face's download and "Loading weights" bars,
    transformers' config notices) kept out of what `sluice model export` prints; their errors still show."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when huggingface_hub is imported ...
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # ... and transformers
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if "huggingface_hub" in sys.modules:  # ... or already were
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        tlog = sys.modules["transformers"].utils.logging
        tlog.set_verbosity_error()
        tlog.disable_progress_bar()
