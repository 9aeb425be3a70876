"""stdout / stderr for a local run whose reader may go away (`sluice local run ... 2>&1 | head -3`).

Python ignores SIGPIPE, so a write to a closed pipe raises BrokenPipeError; raised from the
progress line it would end the run before its output is downloaded and its servers stopped.
A PipeSafe stream stops writing instead: on the first EPIPE (EIO: a terminal that closed) it points the descriptor at
/dev/null (so every later write, by any object holding it, succeeds) and remembers it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class PipeSafe:
    """A text stream that swallows writes once its reader has gone."""

    def __init__(self, stream: TextIO) -> None:
        self._s = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self._s.write(text)
            except OSError as exc:
                self._gone(exc)
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._s.flush()
            except OSError as exc:
                self._gone(exc)

    def isatty(self) -> bool:
        return not self.broken and self._s.isatty()

    def fileno(self) -> int:
        return self._s.fileno()

    def __getattr__(self, name: str) -> Any:  # encoding, errors, buffer, ...
        return getattr(self._s, name)

    def _gone(self, exc: OSError) -> None:
        if exc.errno not in (errno.EPIPE, errno.EINVAL, errno.EIO):  # EIO: the terminal closed (SIGHUP)
            raise exc
        self.broken = True
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._s.fileno())
            os.close(devnull)


@contextlib.contextmanager
def pipe_safe() -> Iterator[tuple[PipeSafe, PipeSafe]]:
    """sys.stdout and sys.stderr as PipeSafe streams while the block runs."""
    saved = sys.stdout, sys.stderr
    out, err = PipeSafe(sys.stdout), PipeSafe(sys.stderr)
    sys.stdout, sys.stderr = out, err  # type: ignore[assignment]
    try:
        yield out, err
    finally:
        sys.stdout, sys.stderr = saved
