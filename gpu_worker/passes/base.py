"""What a rank's two passes share at the rank's level: its sinks and a key's failure in each, torch's set-up,
the rank's metrics, and the run of a pass from loading to its summary (the key's level: gpu_worker.passes.keys).

A pass (the image pass, gpu_worker.passes.images; the parts pass, gpu_worker.passes.parts) is
the small part that differs: how its models load and how keys reach them. `run_pass` runs
either the same way: load (the pass's models, its sinks opened), start metrics, stream the
keys, commit the last chunks (or abort them all on a failure), summarise.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpu_worker.env import ContainerEnv, instance_type
from gpu_worker.log import logger
from gpu_worker.output import intervals
from gpu_worker.output.commits import Paths
from gpu_worker.output.parquet import RecordLabel
from gpu_worker.output.sink import ChunkSink, SinkSpec
from gpu_worker.passes.keys import KeyFailure
from gpu_worker.passes.work import ModelTodo, RankContext, RankWork
from gpu_worker.telemetry.collector import RankCollector
from gpu_worker.telemetry.families import keep_list
from gpu_worker.telemetry.gpu import GpuProbe
from gpu_worker.telemetry.remote_write import PushPolicy
from gpu_worker.telemetry.serve import RankMetrics
from gpu_worker.telemetry.stats import Stats
from sluice.contracts.sections import TIMED_KINDS


@dataclass
class KeySinks:
    """The rank's sinks, one per model: where a key's rows and failures go, and the keys failed for good by reason."""

    sinks: list[ChunkSink]
    stats: Stats
    reasons: Counter[str] = field(default_factory=Counter)  # counted once a key, however many models owed it

    def fail(self, f: KeyFailure) -> None:
        """A key's failure to every sink that still owes it."""
        pos, phase = f.item.pos, f.item.phase
        owners = [sink for sink in self.sinks if sink.owns(pos, phase)]
        for sink in owners:
            if f.obj is not None:  # the failure names the version whose bytes failed
                sink.read_as(pos, f.obj)
            sink.add_failure(pos, f.uri, phase, f.reason, f.detail, f.deferred)
        if owners and not f.deferred:
            self.reasons[f.reason] += 1
            self.stats.incr("failed")

    def hand_off(self, span: intervals.Span, to_shard: int) -> None:
        """`span` was split off to shard `to_shard` (the rank's fence learned it): every sink records it."""
        for sink in self.sinks:
            sink.hand_off(span, to_shard)

    def finish(self, ok: bool) -> None:
        """Commit every sink's last chunks, or (after a failure) commit nothing more."""
        if ok:
            for sink in self.sinks:
                sink.close()
        else:
            for sink in self.sinks:
                sink.abort()

    @property
    def committed(self) -> int:
        return sum(sink.committed for sink in self.sinks)


class ModelOut(Protocol):
    """What a sink needs of a loaded model: its name and version (PartsInfo, ModelInfo) and its output size."""

    output_dim: int

    @property
    def info(self) -> Any: ...


def open_sinks(ctx: RankContext, work: RankWork, models: Sequence[ModelOut]) -> KeySinks:
    """Each model's ChunkSink: its own windows, markers and output folder (RunPlan.model_output_prefix)."""
    return KeySinks(
        [_open_sink(ctx, m, todo, model) for m, (todo, model) in enumerate(zip(work.todos, models))], ctx.stats
    )


def _open_sink(ctx: RankContext, m: int, todo: ModelTodo, model: ModelOut) -> ChunkSink:
    cfg, plan, spec = ctx.cfg, ctx.plan, ctx.spec
    planned = plan.models[m]
    sink = SinkSpec(
        rank=spec.global_rank,
        attempt=spec.attempt,
        windows=intervals.cut(todo.remaining, cfg.chunk_keys),
        chunk_keys=cfg.chunk_keys,
        dtype=cfg.output_dtype or plan.output_dtype,
        metadata={"model": planned.uri, "dim": str(model.output_dim), "run": plan.run_id, "shard": str(spec.shard)},
        label=RecordLabel(planned.name, model.info.version, planned.model_id, plan.run_id),
        retry=[p for p, _ in todo.retry],
        timed=plan.content.kind in TIMED_KINDS,
    )
    paths = Paths.for_shard(plan.model_output_prefix(m), plan.failures_prefix, plan.shards_prefix, spec.shard)
    return ChunkSink(ctx.store, paths, sink, observer=ctx.stats)


def torch_setup(ctx: RankContext, threads: int) -> str:
    """Torch's threads and the rank's device, set once before its models load; returns the device name."""
    import torch

    torch.set_num_threads(threads)
    if ctx.spec.device == "cuda":
        torch.cuda.set_device(ctx.spec.local_rank)
    return ctx.spec.torch_device


class RankPass:
    """A rank's pass: `load` its models and sinks, `stream` every key, `close` what it started (a subclass each)."""

    def __init__(self, ctx: RankContext, work: RankWork) -> None:
        self.ctx, self.work = ctx, work
        self.names: list[str] = []  # each model's name, in the plan's order (once loaded)
        self.outputs = KeySinks([], ctx.stats)  # each model's sink (once loaded)
        self.pipeline_started = time.perf_counter()  # when the part that runs at the models' rate began

    def load(self) -> None:
        raise NotImplementedError

    def stream(self) -> None:
        raise NotImplementedError

    def close(self, ok: bool) -> None:
        """Stop what the pass started (nothing, unless a subclass started something)."""

    def queue_depth(self) -> int:
        """Batches ready and waiting for the models (the prefetch queue's depth gauge)."""
        return 0


def run_pass(ctx: RankContext, p: RankPass, summary: dict[str, Any], started: float) -> dict[str, Any]:
    """Load, stream and commit one pass; its figures added to the rank's `summary` (`started`: the rank's start)."""
    p.load()
    ctx.stats.incr("model_ready_seconds", time.perf_counter() - started)  # the watchdog's load grace ends
    metrics = start_metrics(ctx, p.outputs.reasons, p.queue_depth)
    window_start = time.time() - (time.perf_counter() - p.pipeline_started)
    ok = False
    try:
        p.stream()
        if (split := p.work.fence.handoff()) is not None:
            p.outputs.hand_off(*split)
            summary["handed"] = {"span": list(split[0]), "to_shard": split[1]}
        p.outputs.finish(ok=True)
        ok = True
    finally:
        if not ok:
            p.outputs.finish(ok=False)
        p.close(ok)
        summary["metrics_series"] = metrics.series()
        metrics.stop()
    end = time.perf_counter()
    ctx.stats.incr("rank_cpu_seconds", time.process_time())
    took = end - p.pipeline_started
    summary.update(
        seconds=round(end - started, 3),
        models=p.names,
        pipeline_seconds=round(took, 3),
        pipeline_window=[round(window_start, 3), round(window_start + took, 3)],
        chunks=p.outputs.committed,
        stats=ctx.stats.snapshot(),
        reasons=dict(p.outputs.reasons),
    )
    logger.info("rank done", extra={k: v for k, v in summary.items() if k != "stats"} | {"stats": summary["stats"]})
    return summary


def start_metrics(ctx: RankContext, reasons: Counter[str], queue_depth: Callable[[], int]) -> RankMetrics:
    """This rank's registry: served on /metrics (port + local rank) and pushed to AMP when configured."""
    cfg, plan, spec = ctx.cfg, ctx.plan, ctx.spec
    env = ContainerEnv.from_env()
    labels = {
        "run_id": plan.run_id,
        "shard": str(spec.shard),
        "node": str(spec.node),
        "rank": str(spec.global_rank),
        "gpu": str(spec.local_rank) if spec.device == "cuda" else "",
        "attempt": str(spec.attempt),
        "instance_type": instance_type(env.instance_type),
        "kind": plan.content.kind,  # one value a run: no more series
    }
    collector = RankCollector(
        ctx.stats.snapshot,
        labels,
        reasons=lambda: dict(reasons),
        queue_depth=queue_depth,
        gpu=GpuProbe(spec.local_rank if spec.device == "cuda" else None),
    )
    return RankMetrics(
        collector,
        port=cfg.metrics_port + spec.local_rank if cfg.metrics_port else 0,
        remote_write_url=env.remote_write_url or (plan.remote_write_url or ""),
        push=PushPolicy(interval_s=cfg.push_interval_s, keep=keep_list(cfg.push_metrics)),
    )
