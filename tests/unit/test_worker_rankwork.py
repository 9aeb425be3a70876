"""Property test: the ranks of a node, each walking RankWork.keys(), owe every key of the shard exactly once."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.config import WorkerConfig
from gpu_worker.output import intervals
from gpu_worker.output.commits import MAIN, RETRY, Marker, ShardState
from gpu_worker.passes.work import RankContext, RankSpec, RankWork
from gpu_worker.telemetry.stats import Stats
from sluice.aws.store import ObjectStore
from sluice.shards import encode_shard
from tests.plans import run_plan

spans = st.lists(st.tuples(st.integers(0, 300), st.integers(1, 40)).map(lambda t: (t[0], t[0] + t[1])), max_size=6)


def _state(n: int, covered: list[tuple[int, int]], deferred: list[int]) -> ShardState:
    """An earlier attempt's markers: `covered` settled, `deferred` sent to the final pass and not settled."""
    covers = intervals.subtract(intervals.subtract(covered, [(n, 10**9)]), intervals.from_points(deferred))
    marker = Marker(
        "part-0000-000000000", "range", 0, covers, [(p, f"s3://bkt/k{p:05d}") for p in deferred], [], 1, 0, None
    )
    return ShardState([marker])


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    world=st.integers(1, 5),
    block=st.integers(1, 50),
    covered=spans,
    deferred=st.lists(st.integers(0, 299), max_size=10, unique=True),
)
def test_ranks_walk_every_owed_key_once(tmp_path_factory, n, world, block, covered, deferred):
    root = tmp_path_factory.mktemp("run")
    deferred = [p for p in deferred if p < n]
    keys = [f"k{i:05d}" for i in range(n)]
    plan = run_plan("r", f"{root}/", total_keys=n, job={"attempts": 1})
    Path(plan.shard_uri(0)).parent.mkdir(parents=True, exist_ok=True)
    Path(plan.shard_uri(0)).write_bytes(encode_shard([("bkt", keys)], sort=False, block_keys=block))
    state = _state(n, covered, deferred)
    (root / "state.json").write_bytes(state.to_json())
    walked = []
    for r in range(world):
        spec = RankSpec(0, 0, 2, r, world, "cpu", ["builtin:reference-cnn"], [str(root / "state.json")], n, "")
        ctx = RankContext(spec, WorkerConfig(), plan, ObjectStore(), Stats())
        walked += list(RankWork.of(ctx).keys())
    owed_main = set(range(n)) - set(intervals.positions(state.claimed))
    main = [(pos, key) for pos, _, key, phase in walked if phase == MAIN]
    retry = [(pos, key) for pos, _, key, phase in walked if phase == RETRY]
    assert sorted(main) == [(p, keys[p]) for p in sorted(owed_main)]  # each once, the shard's own key
    assert sorted(retry) == [(p, keys[p]) for p in sorted(deferred)]
