"""Property tests: (nodes x ranks) slices partition every shard; resume arithmetic never double-covers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_worker.output import intervals
from sluice.shards import ShardReader, encode_shard, rank_slice


@settings(max_examples=200, deadline=None)
@given(shard_sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=8), ranks=st.integers(1, 16))
def test_node_and_rank_slices_partition_the_run(shard_sizes, ranks):
    """Node i reads shard i; its ranks split it: every (shard, position) is owned exactly once."""
    owners: dict[tuple[int, int], int] = {}
    for node, n in enumerate(shard_sizes):
        sizes = []
        for local in range(ranks):
            lo, hi = rank_slice(n, ranks, local)
            sizes.append(hi - lo)
            for p in range(lo, hi):
                assert (node, p) not in owners
                owners[(node, p)] = node * ranks + local
        assert max(sizes) - min(sizes) <= 1
    assert set(owners) == {(node, p) for node, n in enumerate(shard_sizes) for p in range(n)}


@settings(max_examples=50, deadline=None)
@given(n=st.integers(0, 300), ranks=st.integers(1, 7), block=st.integers(1, 40))
def test_rank_reads_of_a_real_shard_concatenate_to_the_shard(n, ranks, block):
    keys = [f"k/{i:05d}" for i in range(n)]
    reader = ShardReader(encode_shard([("b", keys)], sort=False, block_keys=block))
    got = []
    for r in range(ranks):
        got.extend(k for _, ks in reader.groups(*rank_slice(n, ranks, r)) for k in ks)
    assert got == keys


runs = st.lists(st.tuples(st.integers(0, 500), st.integers(0, 60)).map(lambda t: (t[0], t[0] + t[1])), max_size=12)


@settings(max_examples=300, deadline=None)
@given(base=runs, removed=runs)
def test_subtract_is_set_difference(base, removed):
    want = set(intervals.positions(intervals.normalize(base))) - set(intervals.positions(intervals.normalize(removed)))
    got = intervals.subtract(base, removed)
    assert list(intervals.positions(got)) == sorted(want)
    assert got == intervals.normalize(got)


@settings(max_examples=300, deadline=None)
@given(base=runs, size=st.integers(1, 50))
def test_cut_windows_partition_in_order(base, size):
    windows = intervals.cut(base, size)
    flat = [p for w in windows for p in intervals.positions(w)]
    assert flat == list(intervals.positions(intervals.normalize(base)))
    assert all(intervals.count(w) == size for w in windows[:-1])


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 400), world=st.integers(1, 6), done=runs, world2=st.integers(1, 6))
def test_resume_with_a_different_world_covers_each_position_once(n, world, done, world2):
    """Attempt 1 settled `done`; attempt 2 (maybe another GPU count) does exactly the rest."""
    done = intervals.subtract(intervals.normalize(done), [(n, 10**9)])
    todo = []
    for r in range(world2):
        todo.extend(intervals.positions(intervals.subtract([rank_slice(n, world2, r)], done)))
    assert len(todo) == len(set(todo))
    assert set(todo) | set(intervals.positions(done)) == set(range(n))
    assert not set(todo) & set(intervals.positions(done))


def test_contains():
    rs = intervals.normalize([(5, 8), (1, 3)])
    assert [p for p in range(10) if intervals.contains(rs, p)] == [1, 2, 5, 6, 7]
