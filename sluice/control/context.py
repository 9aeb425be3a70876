"""One request and one context: what a control-plane invocation works on and with, built once, passed down.

`RunRequest` is the run being started, frozen: its id, manifest, control bucket, the models'
artifact ids (resolved once, sluice.modelid) and its paths. The manifest Lambda builds it after
parsing the upload; the prepare stage's submit step builds it again from the RUN item, the spec
and the manifest the stage stored. `Context` is what one handler invocation (or one sweep) uses:
settings, clients and the adapters built from them (ledger, shard records, event publisher, Batch),
and the stack's capacity (sluice.preflight.Capacity), built once so the plan, the preflight and
the cost decide from the same instance facts.
A run's paths always come from `RunPaths.in_bucket(control bucket, run id)`: through the request,
or from the RUN item (`run_paths`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sluice.aws.clients import Clients
from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts.manifest import Manifest
from sluice.control.batch import BatchAdapter
from sluice.control.notify import EventPublisher
from sluice.control.table.items import RunItem
from sluice.control.table.ledger import Ledger
from sluice.control.table.records import ShardRecords
from sluice.paths import RunPaths
from sluice.preflight import Capacity
from sluice.settings import Settings


@dataclass(frozen=True)
class RunRequest:
    """The run a manifest asks for, as the control plane plans and submits it."""

    run_id: str
    manifest_uri: str
    manifest: Manifest
    control_bucket: str
    model_ids: tuple[str, ...]  # one per manifest model (sluice.modelid), in the manifest's order
    paths: RunPaths = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "paths", RunPaths.in_bucket(self.control_bucket, self.run_id))

    @classmethod
    def of(
        cls, run_id: str, manifest_uri: str, manifest: Manifest, control_bucket: str, model_ids: Sequence[str]
    ) -> RunRequest:
        return cls(run_id, manifest_uri, manifest, control_bucket, tuple(model_ids))


@dataclass(frozen=True)
class Context:
    """Settings, clients and the adapters built from them, for one handler invocation."""

    settings: Settings
    clients: Clients
    ledger: Ledger
    records: ShardRecords
    events: EventPublisher
    batch: BatchAdapter
    capacity: Capacity

    @classmethod
    def build(cls, settings: Settings | None = None, clients: Clients | None = None) -> Context:
        """From the environment (SLUICE_*) and lazy clients, unless injected (tests, the CLI, local mode)."""
        settings = settings or Settings.from_env()
        clients = clients or Clients()
        return cls(
            settings,
            clients,
            Ledger(clients.dynamodb, settings.runs_table),
            ShardRecords(clients.dynamodb, settings.runs_table),
            EventPublisher(clients.events, settings.event_bus),
            BatchAdapter(clients.batch),
            Capacity.build(settings),
        )


def control_bucket(run: RunItem) -> str:
    """The control bucket of a submitted or preparing run: the bucket of its plan (or prepare spec)."""
    uri = run.plan_uri or (run.prepare.spec_uri if run.prepare is not None else None)
    if uri is None:
        raise ValueError(f"run {run.run_id} has neither a plan nor a prepare spec yet")
    return parse_s3_uri(uri)[0]


def run_paths(run: RunItem) -> RunPaths:
    """A submitted or preparing run's paths, from its RUN item."""
    return RunPaths.in_bucket(control_bucket(run), run.run_id)


__all__ = ["Context", "RunRequest", "control_bucket", "run_paths"]
