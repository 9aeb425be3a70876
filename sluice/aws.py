"""Lazy, injectable boto3 clients: one cache per process, shared by the Lambdas, the CLI and the worker."""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

from botocore.config import Config

DEFAULT_CONFIG = Config(retries={"max_attempts": 8, "mode": "adaptive"}, user_agent_extra="sluice")
_lock = threading.Lock()
_clients: dict[tuple[Hashable, ...], Any] = {}


def client(
    service: str, *, config: Config | None = None, endpoint_url: str | None = None, name: Hashable = "default"
) -> Any:
    """A cached boto3 client, created on first use so importing sluice needs no AWS.

    Callers that need a differently tuned client (the worker's image GETs) pass their own
    `config` and a `name` that identifies it: one client per (service, name, endpoint).
    """
    key = (service, name, endpoint_url)
    cached = _clients.get(key)
    if cached is not None:
        return cached
    with _lock:
        if key not in _clients:
            import boto3

            _clients[key] = boto3.session.Session().client(
                service, config=config or DEFAULT_CONFIG, endpoint_url=endpoint_url
            )
        return _clients[key]


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
