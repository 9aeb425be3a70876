"""`python -m gpu_worker`: one AWS Batch array child or MNP node.

Reads plan.json, picks its shard (gpu_worker.env), resumes from committed chunks, runs one
rank per GPU (or SLUICE_WORKER_CPU_RANKS CPU ranks) over contiguous slices of the shard,
then checks every key was settled exactly once and writes failures/<i>.jsonl and
shards/<i>.result.json with its verdict (gpu_worker.output.verdict). Exit codes: 0 done and failed
fraction <= threshold; 1 over the threshold or a runtime failure (one-line reason on stderr);
2 configuration error; 75 a rank stalled (gpu_worker.watchdog; retried); 143 terminated (SIGTERM).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_worker import env as envmod
from gpu_worker.config import WorkerConfig
from gpu_worker.errors import (
    OK,
    STALLED,
    TERMINATED,
    ConfigError,
    RankFailed,
    Stalled,
    Terminated,
    WorkerError,
    exit_code,
    report,
)
from gpu_worker.log import logger, set_labels, setup
from gpu_worker.output import intervals
from gpu_worker.output.commits import Paths, ShardState, load_state, remove_orphans
from gpu_worker.output.result import write_shard_result
from gpu_worker.output.verdict import exit_reason, threshold
from gpu_worker.passes.work import RankSpec
from gpu_worker.rank import run_rank, spec_json
from gpu_worker.sources.clients import control_store
from gpu_worker.telemetry.stats import Stats
from sluice.aws.ranged import RangedObject
from sluice.aws.store import ObjectStore
from sluice.contracts.plan import RunPlan, load_plan
from sluice.contracts.results import ShardError, ShardResult
from sluice.errors import PlanError, ShardFormatError
from sluice.paths import error_uri
from sluice.shards import ShardReader


def detect_device(cfg: WorkerConfig) -> tuple[str, int]:
    """('cuda', ranks) with a GPU (one rank per visible GPU), else ('cpu', cpu_ranks)."""
    if cfg.device == "cpu":
        return "cpu", cfg.cpu_ranks
    maybe_gpu = cfg.device == "cuda" or Path("/dev/nvidiactl").exists() or bool(shutil.which("nvidia-smi"))
    n = 0
    if maybe_gpu:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if cfg.device == "cuda" and n == 0:
        raise ConfigError("SLUICE_WORKER_DEVICE=cuda but no CUDA device is visible")
    if n:
        return "cuda", min(n, cfg.gpu_ranks) if cfg.gpu_ranks else n
    return "cpu", cfg.cpu_ranks


def read_plan(store: ObjectStore, uri: str) -> RunPlan:
    """The run's plan (sluice.contracts.plan.load_plan); a missing or invalid plan is a configuration error."""
    try:
        return load_plan(store.get, uri)
    except PlanError as exc:
        raise ConfigError(str(exc)) from None


@dataclass(frozen=True)
class Node:
    """What this container runs, fixed at start: the plan, its assignment, the device and ranks, the shard's size."""

    plan: RunPlan
    asg: envmod.Assignment
    device: str  # cpu | cuda
    world: int  # ranks on this node
    n_keys: int  # keys in the shard
    started: float  # epoch seconds


def run_node(cfg: WorkerConfig, environ: Mapping[str, str], *, store: ObjectStore | None = None) -> ShardResult:
    """Everything `python -m gpu_worker` does; returns what it wrote to result.json."""
    started = time.time()
    store = store or control_store()
    plan = read_plan(store, envmod.plan_uri(environ))
    asg = envmod.select(plan, environ)
    set_labels(run=plan.run_id, shard=asg.shard, node=asg.node, attempt=asg.attempt)
    try:
        return _run_node(cfg, plan, asg, store, started)
    except Exception as exc:
        last_words(store, plan, asg, exc)
        raise


def last_words(store: ObjectStore, plan: RunPlan, asg: envmod.Assignment, exc: BaseException) -> None:
    """shards/<i>.error.json: the attempt's one-line reason, for the outcome (a failed write is only logged)."""
    code, reason = exit_code(exc)
    if code in (STALLED, TERMINATED):
        return  # retried, and the control plane says why itself
    err = ShardError(run_id=plan.run_id, shard=asg.shard, attempt=asg.attempt, exit_code=code, reason=reason)
    try:
        store.put(error_uri(plan.shards_prefix, asg.shard), err.model_dump_json().encode(), "application/json")
    except Exception as put_exc:
        logger.warning("last words not written", extra={"error": f"{type(put_exc).__name__}: {put_exc}"[:300]})


def _run_node(
    cfg: WorkerConfig, plan: RunPlan, asg: envmod.Assignment, store: ObjectStore, started: float
) -> ShardResult:
    """run_node once the plan and this container's shard are known."""
    # One output folder, set of markers and resume state per model (one model: output/shard=<i>/).
    paths = [
        Paths.for_shard(plan.model_output_prefix(m), plan.failures_prefix, plan.shards_prefix, asg.shard)
        for m in range(len(plan.models))
    ]
    n_keys = _count_keys(store, plan.shard_uri(asg.shard))
    device, world = detect_device(cfg)
    node = Node(plan, asg, device, world, n_keys, started)
    states = [load_state(store, p) for p in paths]
    orphans = [u for p, st in zip(paths, states) for u in remove_orphans(store, p, st)]
    todo = _todo_count(states, n_keys)
    logger.info(
        "node starting",
        extra={
            "kind": asg.kind,
            "n_keys": n_keys,
            "device": device,
            "world": world,
            "global_ranks": [asg.node * world + r for r in range(world)],
            "models": [m.name for m in plan.models],
            "committed_chunks": sum(len(st.markers) for st in states),
            "todo": todo,
            "orphans_removed": len(orphans),
        },
    )
    summaries: list[dict[str, Any]] = []
    own_dir = not cfg.work_dir
    work = tempfile.mkdtemp(prefix="sluice-worker-") if own_dir else cfg.work_dir
    try:
        if todo:
            summaries = _run_ranks(node, _rank_specs(node, states, store, work), cfg, store)
        states = [load_state(store, p, st) for p, st in zip(paths, states)]  # only the ranks' new markers are read
        for p, st in zip(paths, states):
            remove_orphans(store, p, st)
        by_model = {m.name: st for m, st in zip(plan.models, states)}
        return write_shard_result(
            store, paths[0], by_model, n_keys, threshold=threshold(cfg, plan), info=_node_info(node, states, summaries)
        )
    finally:
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)


def _todo_count(states: list[ShardState], n_keys: int) -> int:
    """Keys some model still needs: unclaimed in its markers, or deferred and not yet settled."""
    unclaimed = intervals.normalize(s for st in states for s in intervals.subtract([(0, n_keys)], st.claimed))
    retry = {p for st in states for p, _ in st.pending_retry()}
    return intervals.count(unclaimed) + len(retry)


def _count_keys(store: ObjectStore, shard_uri: str) -> int:
    """Keys in the shard (its header and index only); an unreadable shard fails the attempt."""
    try:
        return ShardReader(RangedObject(store, shard_uri)).n_keys
    except ShardFormatError as exc:
        raise WorkerError(f"shard {shard_uri} is unreadable: {exc}") from None
    except Exception as exc:
        raise WorkerError(f"cannot read shard {shard_uri}: {type(exc).__name__}: {exc}") from None


def _rank_specs(node: Node, states: list[ShardState], store: ObjectStore, work: str) -> list[RankSpec]:
    """One spec per rank; fetches the models and writes each model's resume state into `work` for them."""
    from gpu_worker.models.spec import resolve_uri

    plan, asg = node.plan, node.asg
    # Each model in its own folder: two models may share a file name.
    model_paths = [resolve_uri(m.uri, os.path.join(work, f"m{i}"), store) for i, m in enumerate(plan.models)]
    state_paths = []
    for i, state in enumerate(states):
        state_paths.append(os.path.join(work, f"state-{asg.shard}-m{i}.json"))
        Path(state_paths[-1]).write_bytes(state.to_json())
    return [
        RankSpec(
            shard=asg.shard,
            node=asg.node,
            attempt=asg.attempt,
            local_rank=r,
            world=node.world,
            device=node.device,
            model_paths=model_paths,
            state_paths=state_paths,
            n_keys=node.n_keys,
            summary_path=os.path.join(work, f"rank-{r}.summary.json"),
        )
        for r in range(node.world)
    ]


def _node_info(node: Node, states: list[ShardState], summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The ShardResult fields only the node knows: who ran the shard, where, how long, its ranks' counters."""
    asg = node.asg
    totals = Stats()
    for s in summaries:
        totals.add(s.get("stats", {}))
    return {
        "run_id": node.plan.run_id,
        "shard": asg.shard,
        "node": asg.node,
        "attempt": asg.attempt,
        "kind": asg.kind,
        "device": node.device,
        "world": node.world,
        "seconds": round(time.time() - node.started, 3),
        "pipeline_seconds": max((s.get("pipeline_seconds", 0.0) for s in summaries), default=0.0),
        "pipeline_window": _window(summaries),
        "resumed_chunks": sum(1 for st in states for m in st.markers if m.attempt < asg.attempt),
        "stats": totals.snapshot(),
    }


def _window(summaries: list[dict[str, Any]]) -> list[float]:
    """[first rank's pipeline start, last rank's end] (epoch seconds); [] when nothing ran."""
    windows = [s["pipeline_window"] for s in summaries if s.get("pipeline_window")]
    return [min(w[0] for w in windows), max(w[1] for w in windows)] if windows else []


def _run_ranks(node: Node, specs: list[RankSpec], cfg: WorkerConfig, store: ObjectStore) -> list[dict[str, Any]]:
    """Each rank's summary: one rank runs in this process, several as `python -m gpu_worker.rank` processes."""
    if len(specs) == 1:
        return [run_rank(specs[0], node.plan, cfg, store=store)]
    work = os.path.dirname(specs[0].summary_path)
    procs: list[subprocess.Popen[bytes]] = []
    child_env = {**os.environ, **cfg.to_env()}
    for spec in specs:
        path = os.path.join(work, f"rank-{spec.local_rank}.spec.json")
        Path(path).write_text(spec_json(spec, node.plan))
        procs.append(subprocess.Popen([sys.executable, "-m", "gpu_worker.rank", path], env=child_env))
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = [(s, c) for s, c in zip(specs, codes) if c not in (None, 0)]
            if bad:
                spec, code = bad[0]
                if code == STALLED:
                    raise Stalled(f"rank {spec.global_rank} made no progress")
                raise RankFailed(f"rank {spec.global_rank} exited with code {code}")
            if all(c == 0 for c in codes):
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    out = []
    for spec in specs:
        with open(spec.summary_path) as fh:
            out.append(json.load(fh))
    return out


def _on_sigterm(signum: int, frame: Any) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the process exit code."""
    try:
        cfg = WorkerConfig.from_env()
    except ConfigError as exc:
        return report(exc, "sluice-worker")
    setup(cfg.log_level)
    with contextlib.suppress(ValueError):  # not the main thread (embedded use)
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        result = run_node(cfg, os.environ)
    except Exception as exc:
        return report(exc, "sluice-worker")
    logger.info(
        "shard done",
        extra={
            "processed": result.processed,
            "failed": result.failed,
            "failed_fraction": result.failed_fraction,
            "seconds": result.seconds,
        },
    )
    if not result.ok:
        return report(WorkerError(exit_reason(result)), "sluice-worker")
    return OK
