"""The shard's result: each key settled once by each model, failures/<i>.jsonl, result.json with its verdict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from gpu_worker.errors import WorkerError
from gpu_worker.output import intervals, verdict
from gpu_worker.output.commits import Paths, ShardState
from sluice.aws.store import ObjectStore
from sluice.contracts.results import FailureLine, ShardResult


def write_shard_result(
    store: ObjectStore,
    paths: Paths,
    states: Mapping[str, ShardState],
    n_keys: int,
    *,
    threshold: float,
    info: Mapping[str, Any],
) -> ShardResult:
    """Check each model settled the shard exactly once, write failures/<i>.jsonl and result.json; return the result.

    `states` holds each model's committed markers (one entry for a one-model run); a key is
    failed when some model failed it. `info` holds the ShardResult fields only the node knows
    (who ran it, where, how long); the counts come from the commit markers, and the verdict
    against `threshold` (ok, the reason) from gpu_worker.output.verdict.judge.
    """
    for name, state in states.items():
        _check_settled(state, n_keys, name if len(states) > 1 else "")
    failed: dict[int, dict[str, Any]] = {}
    for state in states.values():
        for m in state.markers:
            for f in m.failed:
                failed.setdefault(int(f["pos"]), f)
    failures = [
        FailureLine(
            key=f["key"],
            reason=f["reason"],
            attempt=f["attempt"],
            detail=f.get("detail", ""),
            etag=f.get("etag"),
            version_id=f.get("version_id"),
        )
        for _, f in sorted(failed.items())
    ]
    lines = "".join(line.model_dump_json() + "\n" for line in failures)
    store.put(paths.failures, lines.encode(), "application/x-ndjson")
    by_model = {name: sum(m.rows for m in state.markers) for name, state in states.items()}
    first = next(iter(states.values()), None)
    markers = first.markers if first is not None else []
    # A span split off to another shard is settled there: this shard answers for the rest.
    handed = max((intervals.count(state.handed) for state in states.values()), default=0)
    own = n_keys - handed
    result = ShardResult(
        **info,
        n_keys=own,
        handed=handed,
        processed=min(by_model.values(), default=0),
        **asdict(verdict.judge(failures, own, threshold)),
        chunks=sum(len(state.markers) for state in states.values()),
        parts=sum(int(m.extra.get("parts", m.rows)) for m in markers),
        media_s=round(sum(float(m.extra.get("media_s", 0.0)) for m in markers), 3),
        processed_by_model=by_model if len(states) > 1 else {},
    )
    store.put(paths.result, result.model_dump_json(indent=1).encode(), "application/json")
    return result


def _check_settled(state: ShardState, n_keys: int, model: str) -> None:
    """Every key of the shard in exactly one of the model's markers."""
    of = f" for model {model}" if model else ""
    overlaps = state.overlaps()
    if overlaps:
        raise WorkerError(f"{intervals.count(overlaps)} keys are covered by two chunks{of} (first {overlaps[0]})")
    unsettled = intervals.subtract([(0, n_keys)], state.covered)
    if unsettled:
        raise WorkerError(
            f"{intervals.count(unsettled)} of {n_keys} keys were never settled{of} (first {unsettled[0]})"
        )
