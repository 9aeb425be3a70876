"""Pydantic model of "Batch Job State Change" (Powertools has none), tolerant of new fields,
and what Sluice derives from one: which run, which shard, which attempt, how it ended."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field

from sluice.contracts.status import JobStatus
from sluice.control.batch import RUN_TAG
from sluice.control.policy import is_host_lost


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class ArrayProperties(_Open):
    index: int | None = None
    size: int | None = None


class NodeDetails(_Open):
    node_index: int = Field(alias="nodeIndex")
    is_main_node: bool = Field(default=False, alias="isMainNode")


class BatchJobStateChangeDetail(_Open):
    """The fields Sluice reads; everything else is kept but ignored."""

    job_id: str = Field(alias="jobId")
    job_name: str = Field(alias="jobName")
    job_queue: str = Field(alias="jobQueue")
    status: JobStatus
    status_reason: str | None = Field(default=None, alias="statusReason")
    attempts: list[dict[str, Any]] = Field(default_factory=list)
    container: dict[str, Any] | None = None
    tags: dict[str, str] = Field(default_factory=dict)
    array_properties: ArrayProperties | None = Field(default=None, alias="arrayProperties")
    node_details: NodeDetails | None = Field(default=None, alias="nodeDetails")
    node_properties: dict[str, Any] | None = Field(default=None, alias="nodeProperties")
    created_at: int | None = Field(default=None, alias="createdAt")
    # Not in Batch's event: the attempts before this job when Sluice re-submitted a stalled shard
    # (JobLayoutItem.attempt_base), so its attempts outrank the terminated one's.
    attempt_base: int = Field(default=0, alias="sluiceAttemptBase")

    @property
    def run_id(self) -> str | None:
        """From the run tag, else from the job name `sluice-<run id>-<job index>`."""
        tagged = self.tags.get(RUN_TAG)
        if tagged:
            return tagged
        if self.job_name.startswith("sluice-") and "-" in self.job_name[7:]:
            return self.job_name[7:].rsplit("-", 1)[0]
        return None

    @property
    def parent_id(self) -> str:
        """The submitted job's id: array children are `<id>:<i>`, MNP nodes `<id>#<n>`."""
        return self.job_id.split(":", 1)[0].split("#", 1)[0]

    @property
    def child_index(self) -> int | None:
        """Array index or node index of a child/node event; None for the submitted job itself."""
        if ":" in self.job_id:
            return (
                self.array_properties.index
                if self.array_properties and self.array_properties.index is not None
                else int(self.job_id.rsplit(":", 1)[1])
            )
        if "#" in self.job_id:
            return self.node_details.node_index if self.node_details else int(self.job_id.rsplit("#", 1)[1])
        return None

    @property
    def attempt(self) -> int:
        """1-based attempt this event describes (attempts[] lists finished and running attempts)."""
        n = len(self.attempts)
        if self.status.terminal:
            return self.attempt_base + max(n, 1)
        if n and "stoppedAt" not in self.attempts[-1]:
            return self.attempt_base + n
        waiting = self.status in (JobStatus.RUNNABLE, JobStatus.STARTING, JobStatus.RUNNING)
        return self.attempt_base + (n + 1 if waiting else max(n, 1))

    @property
    def seq(self) -> int:
        """Total order of this shard's events: later attempts first, then the state rank."""
        return self.attempt * 10 + self.status.rank

    @property
    def exit_code(self) -> int | None:
        """container.exitCode, else the last attempt's (container or ECS task containers)."""
        if self.container and self.container.get("exitCode") is not None:
            return int(self.container["exitCode"])
        if not self.attempts:
            return None
        last = self.attempts[-1]
        if isinstance(last.get("container"), dict) and last["container"].get("exitCode") is not None:
            return int(last["container"]["exitCode"])
        if last.get("exitCode") is not None:
            return int(last["exitCode"])
        codes = [c.get("exitCode") for t in last.get("taskProperties", []) for c in t.get("containers", [])]
        codes = [c for c in codes if c is not None]
        return next((int(c) for c in codes if c != 0), int(codes[0]) if codes else None)

    @property
    def reason(self) -> str | None:
        """statusReason, else the last attempt's; then its container's reason (an OOM kill, the worker's words)."""
        last = self.attempts[-1] if self.attempts else {}
        said = last.get("container", {}).get("reason") if isinstance(last.get("container"), dict) else None
        base = self.status_reason or (str(last["statusReason"]) if last.get("statusReason") else None)
        if said and base and said not in base:
            return f"{base}: {said}"
        return base or (str(said) if said else None)

    @property
    def spot_reclaimed(self) -> bool:
        """True when an attempt ended because its instance went away (Spot reclaim)."""
        reasons = [self.status_reason or ""] + [str(a.get("statusReason", "")) for a in self.attempts]
        return any(is_host_lost(r) for r in reasons)


class BatchJobStateChangeEvent(EventBridgeModel):
    """The EventBridge envelope with a typed detail."""

    detail: BatchJobStateChangeDetail  # type: ignore[assignment]
