"""Concurrent delivery for tests: items split round-robin over threads, every error reported."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any


def deliver_concurrently(items: Sequence[Any], threads: int, deliver: Callable[[Any], None]) -> None:
    """Call deliver(item) for every item from `threads` threads (each its share, in order); raise on any error."""
    errors: list[BaseException] = []

    def work(part: Sequence[Any]) -> None:
        try:
            for item in part:
                deliver(item)
        except BaseException as exc:  # reported below
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(items[i::threads],)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []
