"""Small process helpers: CPU count, dying with the parent, shared-memory names."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import signal

PR_SET_PDEATHSIG = 1


def cpu_count() -> int:
    """CPUs this process may run on (affinity-aware)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def die_with_parent(expected_parent: int | None = None) -> None:
    """Linux: get SIGKILL when the parent dies, so ranks and loaders never outlive their node."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)  # the parent died before prctl took effect


def shm_prefix(run_id: str, shard: int) -> str:
    """Short, deterministic shared-memory name prefix for one shard (a rerun reclaims stale segments)."""
    return "sluice-" + hashlib.sha256(f"{run_id}\0{shard}".encode()).hexdigest()[:10]
