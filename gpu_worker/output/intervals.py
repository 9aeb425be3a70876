"""Spans: half-open intervals [a, b) of shard positions (what a rank must still do, what a chunk covers)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

Span = tuple[int, int]


def normalize(spans: Iterable[Span]) -> list[Span]:
    """Sorted, merged, non-empty spans."""
    out: list[Span] = []
    for a, b in sorted(r for r in spans if r[1] > r[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def from_points(points: Iterable[int]) -> list[Span]:
    """Spans covering exactly the given positions."""
    return normalize((p, p + 1) for p in points)


def subtract(spans: Iterable[Span], removed: Iterable[Span]) -> list[Span]:
    """Positions of `spans` that are not in `removed`."""
    cut = normalize(removed)
    out: list[Span] = []
    for a, b in normalize(spans):
        i = max(bisect_right(cut, (a, a)) - 1, 0)
        pos = a
        while i < len(cut) and cut[i][0] < b:
            ca, cb = cut[i]
            if cb > pos:
                if ca > pos:
                    out.append((pos, min(ca, b)))
                pos = max(pos, cb)
            i += 1
        if pos < b:
            out.append((pos, b))
    return out


def count(spans: Iterable[Span]) -> int:
    return sum(b - a for a, b in spans)


def positions(spans: Iterable[Span]) -> Iterable[int]:
    for a, b in spans:
        yield from range(a, b)


def cut(spans: Iterable[Span], size: int) -> list[list[Span]]:
    """Split spans into consecutive windows of `size` positions (the last may be smaller)."""
    if size < 1:
        raise ValueError("window size must be >= 1")
    windows: list[list[Span]] = []
    cur: list[Span] = []
    room = size
    for a, b in normalize(spans):
        while a < b:
            take = min(room, b - a)
            cur.append((a, a + take))
            a += take
            room -= take
            if room == 0:
                windows.append(cur)
                cur, room = [], size
    if cur:
        windows.append(cur)
    return windows


def contains(spans: list[Span], p: int) -> bool:
    """True when p is in the (normalized) spans."""
    i = bisect_right(spans, (p, float("inf"))) - 1  # type: ignore[arg-type]
    return i >= 0 and spans[i][0] <= p < spans[i][1]
