"""What the prepare stage produced, read from its result objects: a rejection with reasons, or the totals."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sluice.aws.s3uri import s3_uri
from sluice.aws.store import ObjectStore
from sluice.contracts.plan import SKIPPED_FAILED, SKIPPED_UNCHANGED
from sluice.contracts.prepare import KeyListRange, MapResult, PrefixRange, PrepareSpec, ReduceResult
from sluice.errors import MAX_REASONS
from sluice.paths import RunPaths
from sluice.prepare.reducer.parts import IO_THREADS, PrepareError, load_map_results, read_result


@dataclass(frozen=True)
class Collected:
    """Either `rejected` (reasons, each naming the key or line) or the totals the plan is built from."""

    rejected: list[str] | None
    keys_in: int = 0
    unique_keys: int = 0
    duplicates: int = 0
    n_shards: int = 0
    shard_keys: list[int] = field(default_factory=list)
    map_seconds: float = 0.0  # the slowest map worker
    reduce_seconds: float = 0.0  # the slowest reduce worker
    peak_rss_mb_per_worker: float = 0.0  # the most any one map or reduce worker held
    problem_count: int = 0
    # An incremental run: keys left out by reason, the staged shards per partition (placed by the
    # submit step: sluice.prepare.reducer.versions.place_shards), and the map workers' version counts.
    skipped: dict[str, int] = field(default_factory=dict)
    pieces: list[int] = field(default_factory=list)
    versions: dict[str, int] = field(default_factory=dict)
    buckets: list[str] = field(default_factory=list)  # the buckets the keys name (RunPlan.input_buckets)

    def summary(self, spec: PrepareSpec) -> dict[str, Any]:
        """The prepare stage in a run's summary (`sluice local run --json`, `sluice prepare --json`)."""
        return {
            "workers": spec.workers,
            "partitions": spec.partitions,
            "keys_in": self.keys_in,
            "unique_keys": self.unique_keys,
            "duplicates": self.duplicates,
            "shards": self.n_shards,
            "seconds": self.seconds,
            "peak_rss_mb_per_worker": self.peak_rss_mb_per_worker,
            **({"skipped": self.skipped, "versions": self.versions} if spec.incremental else {}),
        }

    @property
    def seconds(self) -> float:
        """The stage's critical path: slowest map worker, then slowest reduce worker."""
        return round(self.map_seconds + self.reduce_seconds, 3)


def problem_reasons(spec: PrepareSpec, results: list[MapResult]) -> tuple[list[str], int]:
    """The map workers' problems as reasons with global line numbers (task order), and how many in all."""
    lines: dict[int, int] = {}
    for m in results:
        lines.update(zip(m.tasks, m.task_lines))
    before: dict[int, int] = {}  # task -> lines of the earlier tasks of the same key list
    seen: dict[str, int] = {}
    for t, task in enumerate(spec.tasks):
        if isinstance(task, KeyListRange):
            before[t] = seen.get(task.uri, 0)
            seen[task.uri] = before[t] + lines.get(t, 0)
    problems = sorted((p for m in results for p in m.problems), key=lambda p: (p.task, p.line or 0))
    reasons = []
    for p in problems[:MAX_REASONS]:
        task = spec.tasks[p.task]
        if isinstance(task, KeyListRange) and p.line is not None:
            name = task.uri.rsplit("/", 1)[-1]
            reasons.append(f"{name} line {before[p.task] + p.line}: {p.reason}")
        else:
            reasons.append(p.reason)
    total = sum(m.problem_count for m in results)
    if total > len(reasons):
        reasons.append(f"... and {total - len(reasons)} more problems")
    return reasons, total


def _zero_keys(spec: PrepareSpec) -> str:
    task = spec.tasks[0] if spec.tasks else None
    if isinstance(task, PrefixRange):
        uri = s3_uri(task.bucket, task.prefix)
        return f"prefix {uri} matched no objects" + (f" ending in {tuple(spec.suffixes)}" if spec.suffixes else "")
    return "the input names zero keys: nothing to run"


def collect(spec: PrepareSpec, store: ObjectStore) -> Collected:
    """Read the P MapResults and (unless a map worker found bad input) the R ReduceResults."""
    maps = load_map_results(spec, store)
    peak = max(m.peak_rss_mb for m in maps)
    map_s = max(m.seconds for m in maps)
    if any(m.problem_count for m in maps):
        reasons, total = problem_reasons(spec, maps)
        return Collected(rejected=reasons, map_seconds=map_s, peak_rss_mb_per_worker=peak, problem_count=total)
    paths = RunPaths(spec.root)

    def load(r: int) -> ReduceResult:
        raw = read_result(store, paths.reduce_result(r), f"reduce worker {r}")
        return ReduceResult.model_validate_json(raw)

    with ThreadPoolExecutor(IO_THREADS) as pool:
        reduces = list(pool.map(load, range(spec.partitions)))
    shard_keys: list[int] = []
    for res in reduces:
        if res.skipped or (res.first_shard != len(shard_keys) and not res.staged):
            raise PrepareError(
                f"reduce worker {res.partition}'s shards start at {res.first_shard}, expected {len(shard_keys)}: "
                "its result is from another run of the map job; rerun the reduce job"
            )
        shard_keys += res.shard_keys
    keys_in = sum(m.keys_in for m in maps)
    unique = sum(r.unique_keys for r in reduces)
    failed_before = sum(r.skipped_failed for r in reduces)
    skipped = sum(r.skipped_unchanged for r in reduces) + failed_before
    totals = Collected(
        rejected=None,
        keys_in=keys_in,
        unique_keys=unique - skipped,  # what the shards hold
        duplicates=keys_in - unique,
        n_shards=len(shard_keys),
        shard_keys=shard_keys,
        map_seconds=map_s,
        reduce_seconds=max(r.seconds for r in reduces),
        peak_rss_mb_per_worker=max(peak, *(r.peak_rss_mb for r in reduces)),
        skipped=(
            {SKIPPED_UNCHANGED: skipped - failed_before} | ({SKIPPED_FAILED: failed_before} if failed_before else {})
            if spec.incremental
            else {}
        ),
        pieces=[len(r.shard_keys) for r in reduces] if any(r.staged for r in reduces) else [],
        versions=_version_counts(maps),
        buckets=sorted({b for m in maps for b in m.buckets})[:100],
    )
    if unique == 0:
        return _reject(totals, _zero_keys(spec))
    if unique == skipped:
        return _reject(totals, _all_unchanged(spec, unique, failed_before))
    if unique > spec.max_keys:
        return _reject(
            totals,
            f"{unique} unique keys, more than the {spec.max_keys} a run may hold (SLUICE_MAX_KEYS): "
            "split the input into several manifests",
        )
    return totals


def _all_unchanged(spec: PrepareSpec, unique: int, failed_before: int = 0) -> str:
    bad = (
        f"; {failed_before} of them failed for their data before with the same bytes (failures/ of those runs "
        "lists them: fix or replace those objects)"
        if failed_before
        else ""
    )
    return (
        f"input.since_run: nothing to embed: each of the {unique} unique keys is unchanged since the output of "
        f"{', '.join(spec.lineage)} (same object version, same model_id, its artifact and preprocessing, for every "
        f"model){bad}; that output "
        f"is already complete for this input (read it with `sluice output sql {spec.lineage[0]}`)"
    )


def _version_counts(maps: list[MapResult]) -> dict[str, int]:
    """The map workers' VersionCounts summed (an incremental run; empty otherwise)."""
    out: dict[str, int] = {}
    for m in maps:
        if m.versions is not None:
            for k, v in m.versions.model_dump(exclude={"partition_records"}).items():
                out[k] = out.get(k, 0) + int(v)
    return out


def _reject(c: Collected, reason: str) -> Collected:
    return Collected(
        rejected=[reason],
        keys_in=c.keys_in,
        unique_keys=c.unique_keys,
        duplicates=c.duplicates,
        map_seconds=c.map_seconds,
        reduce_seconds=c.reduce_seconds,
        peak_rss_mb_per_worker=c.peak_rss_mb_per_worker,
        skipped=c.skipped,
        versions=c.versions,
    )
