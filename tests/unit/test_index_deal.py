"""How a distributed index build spreads a table over its children (sluice.index.fleet.deal), and its GPU choice."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.index.fleet.build import accelerator
from sluice.index.fleet.deal import FRAGMENTS_PER_CHILD, LANCE_FILE_ROWS, MIN_FRAGMENT_ROWS, deal, fragment_rows
from tests.properties import examples

fragments = st.lists(st.integers(min_value=1, max_value=2_000_000), max_size=60).map(
    lambda rows: [(fid * 3 + 1, r) for fid, r in enumerate(rows)]  # ids need not be 0..n-1
)


@settings(max_examples=examples(200), deadline=None)
@given(fragments, st.integers(min_value=1, max_value=40))
def test_every_fragment_goes_to_exactly_one_child_and_the_shares_are_within_one_fragment(frags, children):
    shares = deal(frags, children)
    assert len(shares) == children
    dealt = [f for share in shares for f in share]
    assert sorted(dealt) == sorted(fid for fid, _ in frags)  # complete and disjoint: each id once
    rows = dict(frags)
    loads = [sum(rows[f] for f in share) for share in shares]
    biggest = max(rows.values(), default=0)
    assert max(loads) - min(loads) <= biggest


def test_fragments_are_bounded_so_each_child_gets_several():
    assert fragment_rows(1_000_000, 2) == 62_500  # 16 fragments: 8 a child
    assert fragment_rows(24_000, 2) == MIN_FRAGMENT_ROWS * 1.5
    assert fragment_rows(300_000_000, 30) == LANCE_FILE_ROWS  # a merge's own files are small enough
    assert fragment_rows(5_000, 4) == MIN_FRAGMENT_ROWS
    assert FRAGMENTS_PER_CHILD * 2 * fragment_rows(1_000_000, 2) == 1_000_000


def _torch(cuda: bool) -> SimpleNamespace:
    return SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: cuda))


def test_training_goes_to_the_gpu_only_when_torch_sees_cuda():
    assert accelerator(_torch(True)) == "cuda"
    assert accelerator(_torch(False)) is None
    assert accelerator() is None  # this machine: torch without CUDA, so a CPU run is unchanged
