"""The local EventBridge: each event to the real handlers whose template rules match, in the template's environment."""

from __future__ import annotations

import importlib
import os
from collections import Counter
from typing import Any

from sluice.local.emulator.events import matches
from sluice.local.emulator.lambda_context import LocalContext


class Router:
    """Delivers events to the functions whose template rules match (the real handlers)."""

    def __init__(self, stack: Any, env: dict[str, str] | None = None) -> None:
        self._stack = stack
        self._env = env or {}  # on top of every function's template environment
        self.delivered = Counter[str]()

    def __call__(self, event: dict[str, Any]) -> list[Any]:
        out = []
        for rule, pattern in self._stack.rule_patterns.items():
            if matches(pattern, event):
                out.append(self._invoke(self._stack.rule_function[rule], event))
                self.delivered[rule] += 1
        return out

    def _invoke(self, function: str, event: dict[str, Any]) -> Any:
        env = {**self._stack.env_for(function), **self._env}
        env["POWERTOOLS_LOG_LEVEL"] = os.environ.get("SLUICE_LOCAL_LOG_LEVEL", "WARNING")
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            module, name = self._stack.function_handlers[function].rsplit(".", 1)
            handler = getattr(importlib.import_module(module), name)
            return handler(event, LocalContext(function_name=function))
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
