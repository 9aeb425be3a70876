"""One exception per failure mode; messages say what was wrong and what to do next."""

from __future__ import annotations


class SluiceError(Exception):
    """Base class for every error Sluice raises on purpose."""


class SettingsError(SluiceError):
    """An environment variable holds a value Sluice cannot use; the message names it."""


class TooBigForLambda(SluiceError):
    """The in-Lambda scan met more keys than the Lambda can plan: the input goes to the prepare job."""

    def __init__(self, keys_seen: int):
        super().__init__(f"over {keys_seen} keys: too many to plan in the manifest Lambda")
        self.keys_seen = keys_seen


class PlanError(SluiceError):
    """A plan.json cannot be read or is not a valid plan."""


class ShardFormatError(SluiceError):
    """A shard file is truncated, corrupt, or of an unknown version."""


MAX_REASONS = 20
MAX_REASON_CHARS = 1000


class Rejection(SluiceError):
    """The manifest (or the keys it names) cannot be run; nothing was submitted.

    At most MAX_REASONS reasons of at most MAX_REASON_CHARS each (plus a count of the rest):
    they go into one ledger item and one event, which must stay far below DynamoDB's 400 KB
    and EventBridge's 256 KB whatever the input (10,000 mistyped keys, a field name 1 MB long).
    """

    def __init__(self, reasons: list[str] | str):
        given = [reasons] if isinstance(reasons, str) else list(reasons)
        if len(given) > MAX_REASONS + 1:
            given = [*given[:MAX_REASONS], f"... and {len(given) - MAX_REASONS} more problems"]
        self.reasons = [r if len(r) <= MAX_REASON_CHARS else r[: MAX_REASON_CHARS - 3] + "..." for r in given]
        super().__init__("; ".join(self.reasons))


class RetriableError(SluiceError):
    """A transient AWS failure (throttling, 5xx): the caller should retry later."""


class SubmissionError(SluiceError):
    """AWS Batch refused the job for a reason a retry will not fix."""
