"""What a rank is given and owes: its spec, its fixed inputs, and the keys each of its models still needs."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from gpu_worker.config import WorkerConfig
from gpu_worker.output import intervals
from gpu_worker.output.commits import MAIN, RETRY, ShardState
from gpu_worker.passes.keys import Item
from gpu_worker.telemetry.stats import Stats
from sluice.aws.ranged import RangedObject
from sluice.aws.s3uri import parse_s3_uri
from sluice.aws.store import ObjectStore
from sluice.contracts.plan import RunPlan
from sluice.shards import ShardReader, rank_slice


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs besides the plan (the node writes it as JSON for a rank process)."""

    shard: int
    node: int
    attempt: int
    local_rank: int
    world: int
    device: str  # cpu | cuda
    model_paths: list[str]  # local copy of each model of the plan, in its order
    state_paths: list[str]  # each model's committed markers (ShardState JSON): models resume on their own
    n_keys: int
    summary_path: str

    @property
    def global_rank(self) -> int:
        return self.node * self.world + self.local_rank

    @property
    def torch_device(self) -> str:
        """The device name torch runs this rank's models on: cuda:<local rank>, or cpu."""
        return f"cuda:{self.local_rank}" if self.device == "cuda" else "cpu"


@dataclass(frozen=True)
class RankContext:
    """One rank's fixed inputs, built once: its spec, the worker's settings, the run's plan, the store, its counters."""

    spec: RankSpec
    cfg: WorkerConfig
    plan: RunPlan
    store: ObjectStore
    stats: Stats

    @property
    def batch(self) -> int:
        """Items per model step for every model of the pass: SLUICE_WORKER_BATCH_SIZE, else the plan's."""
        return self.cfg.batch_size or self.plan.effective_batch


@dataclass(frozen=True)
class ModelTodo:
    """What one model still owes in this rank's slice: spans no commit claims yet, deferred (position, uri)."""

    remaining: list[intervals.Span]
    retry: list[tuple[int, str]]


class Admits(Protocol):
    """Whether a main-pass position may start (gpu_worker.fence.RankFence: below its reservation, before a split)."""

    def admit(self, pos: int) -> bool: ...

    def handoff(self) -> tuple[intervals.Span, int] | None:
        """The span split off to another shard and that shard, once learned."""
        ...


class _Open:
    def admit(self, pos: int) -> bool:
        return True

    def handoff(self) -> tuple[intervals.Span, int] | None:
        return None


OPEN = _Open()  # no fence: every position starts (tests, and work built before the rank's fence)


@dataclass(frozen=True)
class RankWork:
    """The rank's keys: every model's remaining spans (each key fetched once for all), then deferred keys."""

    slice: intervals.Span
    todos: list[ModelTodo]  # one per model, in the plan's order
    remaining: list[intervals.Span]
    retry: list[tuple[int, str]]
    reader: Callable[[], ShardReader]
    floor: int  # past every position some model has claimed in the slice: a split may start no lower
    fence: Admits = OPEN

    @classmethod
    def of(cls, ctx: RankContext) -> RankWork:
        """This rank's slice of the shard and what each model still owes in it (from the node's state files)."""
        spec = ctx.spec
        lo, hi = rank_slice(spec.n_keys, spec.world, spec.local_rank)
        todos = []
        floor = lo
        for path in spec.state_paths:
            with open(path, "rb") as fh:
                state = ShardState.from_json(fh.read())
            remaining = intervals.subtract([(lo, hi)], state.claimed)
            todos.append(ModelTodo(remaining, [(p, u) for p, u in state.pending_retry() if lo <= p < hi]))
            floor = max([floor, *(min(b, hi) for a, b in state.claimed if a < hi and b > lo)])
        shard_uri = ctx.plan.shard_uri(spec.shard)
        return cls(
            (lo, hi),
            todos,
            intervals.normalize(span for t in todos for span in t.remaining),
            sorted({p: u for t in todos for p, u in t.retry}.items()),
            lambda: ShardReader(RangedObject(ctx.store, shard_uri)),
            floor,
        )

    @property
    def empty(self) -> bool:
        return not self.remaining and not self.retry

    def keys(self) -> Iterator[Item]:
        """The rank's keys in shard order: its remaining spans (phase MAIN), then earlier attempts' deferred keys."""
        remaining = self.remaining
        if remaining:
            pos = remaining[0][0]
            for bucket, keys in self.reader().groups(remaining[0][0], remaining[-1][1]):
                for key in keys:
                    if intervals.contains(remaining, pos):
                        if not self.fence.admit(pos):
                            break  # the rest of the slice was split off to another shard
                        yield Item(pos, bucket, key, MAIN)
                    pos += 1
                else:
                    continue
                break
        for pos, uri in self.retry:
            bucket, key = parse_s3_uri(uri)
            yield Item(pos, bucket, key, RETRY)
