"""One exception per failure mode; messages say what was wrong and what to do next."""

from __future__ import annotations


class SluiceError(Exception):
    """Base class for every error Sluice raises on purpose."""


class ShardFormatError(SluiceError):
    """A shard file is truncated, corrupt, or of an unknown version."""


class ManifestRejected(SluiceError):
    """The manifest (or the keys it names) cannot be run; nothing was submitted."""

    def __init__(self, reasons: list[str] | str):
        self.reasons = [reasons] if isinstance(reasons, str) else list(reasons)
        super().__init__("; ".join(self.reasons))


class RetriableError(SluiceError):
    """A transient AWS failure (throttling, 5xx): the caller should retry later."""


class SubmissionError(SluiceError):
    """AWS Batch refused the job for a reason a retry will not fix."""


class DuplicateRun(SluiceError):
    """The run was already claimed by an earlier delivery of the same upload."""
