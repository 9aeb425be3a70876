"""Structured JSON log lines (one object a line) carrying the worker's labels."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_LABELS: dict[str, Any] = {}
_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "msg": record.getMessage(),
            **_LABELS,
        }
        out.update({k: v for k, v in record.__dict__.items() if k not in _RESERVED and not k.startswith("_")})
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup(level: str = "INFO", **labels: Any) -> logging.Logger:
    """Configure the 'sluice.worker' logger once per process; labels go on every line."""
    set_labels(**labels)
    log = logging.getLogger("sluice.worker")
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonFormatter())
        log.addHandler(handler)
        log.propagate = False
    log.setLevel(level.upper())
    return log


def set_labels(**labels: Any) -> None:
    _LABELS.update({k: v for k, v in labels.items() if v is not None})


logger = logging.getLogger("sluice.worker")
