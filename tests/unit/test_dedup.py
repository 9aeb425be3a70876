"""Duplicate detection keeps the first occurrence and counts the rest."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.plan.dedup import DuplicateFinder


def _dups(bitmap: bytearray, n: int) -> list[int]:
    return [i for i in range(n) if bitmap[i >> 3] >> (i & 7) & 1]


def test_later_occurrences_are_marked_across_batches_and_buckets():
    f = DuplicateFinder()
    f.add("a", ["x", "y", "x"])
    f.add("b", ["x"])  # same key, other bucket: not a duplicate
    f.add("a", ["y", "z"])
    bitmap, n = f.duplicates()
    assert n == 2
    assert _dups(bitmap, 6) == [2, 4]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.text(max_size=4)), max_size=300))
def test_matches_a_set_based_reference(pairs):
    f = DuplicateFinder()
    for bucket, key in pairs:
        f.add(bucket, [key])
    bitmap, n = f.duplicates()
    seen, expected = set(), []
    for i, p in enumerate(pairs):
        if p in seen:
            expected.append(i)
        seen.add(p)
    assert _dups(bitmap, len(pairs)) == expected and n == len(expected)


def test_memory_is_twenty_bytes_a_key():
    f = DuplicateFinder()
    f.add("images", [f"k{i}" for i in range(1000)])
    assert f.memory_bytes() == 20 * 1000
