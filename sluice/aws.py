"""Lazy, injectable boto3 clients (one set per process; tests pass their own)."""

from __future__ import annotations

import threading
from typing import Any

from botocore.config import Config

_CONFIG = Config(retries={"max_attempts": 8, "mode": "adaptive"}, user_agent_extra="sluice")
_lock = threading.Lock()
_clients: dict[str, Any] = {}


def client(service: str) -> Any:
    """A cached boto3 client; created on first use so importing sluice needs no AWS."""
    cached = _clients.get(service)
    if cached is not None:
        return cached
    with _lock:
        if service not in _clients:
            import boto3

            _clients[service] = boto3.session.Session().client(service, config=_CONFIG)
        return _clients[service]


def reset_clients() -> None:
    """Forget cached clients (after changing AWS_ENDPOINT_URL or credentials)."""
    with _lock:
        _clients.clear()


class Clients:
    """The clients one unit of work uses; any can be injected, the rest come lazily."""

    def __init__(self, **injected: Any) -> None:
        self._injected = injected

    def __getattr__(self, service: str) -> Any:
        if service.startswith("_"):
            raise AttributeError(service)
        return self._injected.get(service) or client(service)
