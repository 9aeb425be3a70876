"""Worker exceptions, the per-object failure, and the one exception -> exit code ladder."""

from __future__ import annotations

import sys

from sluice.contracts.status import TRANSIENT_FAILURE_REASONS, FailureReason
from sluice.errors import SettingsError


class WorkerError(Exception):
    """Base class for errors the worker raises on purpose (one-line messages)."""


class ConfigError(WorkerError, SettingsError):
    """The environment or the plan is missing something or is inconsistent (exit code 2)."""


class RankFailed(WorkerError):
    """A rank or loader process died or raised; the attempt fails and a retry resumes."""


class Terminated(Exception):
    """SIGTERM (AWS Batch timeout or job termination)."""


class Stalled(WorkerError):
    """A rank made no progress for stall_after_s (gpu_worker.watchdog); the retry strategy retries it."""


class ExportError(Exception):
    """A model spec that cannot be exported (unknown name, unsupported shape, a failed check): `sluice model export`."""


class ObjectFailure(Exception):
    """One object failed; `transient` ones are retried, then deferred to the final pass.

    `transient` defaults to whether the reason is one the run's retry pass retries
    (sluice.contracts.status.TRANSIENT_FAILURE_REASONS).
    """

    def __init__(self, reason: FailureReason, detail: str = "", *, transient: bool | None = None) -> None:
        super().__init__(f"{reason}: {detail}" if detail else str(reason))
        self.reason = reason
        self.detail = detail[:300]
        self.transient = reason in TRANSIENT_FAILURE_REASONS if transient is None else transient


OK, FAILED, CONFIG, TERMINATED = 0, 1, 2, 143
STALLED = 75  # sluice.control.policy.STALLED_EXIT: the retry strategy retries it (EX_TEMPFAIL)


def exit_code(exc: BaseException) -> tuple[int, str]:
    """The exit code of a worker process that `exc` ended, and its one-line reason.

    1: a runtime failure (WorkerError) or a crash (anything else); 2: a configuration error;
    75: a rank stalled; 143: SIGTERM. The node and each rank process both use this.
    """
    if isinstance(exc, ConfigError):
        return CONFIG, f"configuration error: {exc}"
    if isinstance(exc, Terminated):
        return TERMINATED, "terminated (SIGTERM); committed chunks are kept for the next attempt"
    if isinstance(exc, Stalled):
        return STALLED, f"stalled: {exc}; committed chunks are kept for the next attempt"
    if isinstance(exc, WorkerError):
        return FAILED, f"failed: {exc}"
    return FAILED, f"crashed: {type(exc).__name__}: {exc}"


def crashed(exc: BaseException) -> bool:
    """An exception the worker did not raise on purpose (its traceback is worth logging)."""
    return not isinstance(exc, WorkerError | Terminated)


def report(exc: BaseException, who: str, *, role: str = "worker") -> int:
    """Say on stderr why `who` ends (`<who>: <reason>`, one line), log a crash's traceback; return the exit code."""
    code, reason = exit_code(exc)
    if crashed(exc):
        from gpu_worker.log import logger

        logger.error(f"{role} crashed", exc_info=exc)
    print(f"{who}: {reason}", file=sys.stderr)
    return code
