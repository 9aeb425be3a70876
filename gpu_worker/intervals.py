"""Half-open integer intervals [a, b): what a rank must still do, what a chunk covers."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

Run = tuple[int, int]


def normalize(runs: Iterable[Run]) -> list[Run]:
    """Sorted, merged, non-empty runs."""
    out: list[Run] = []
    for a, b in sorted(r for r in runs if r[1] > r[0]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def from_points(points: Iterable[int]) -> list[Run]:
    """Runs covering exactly the given positions."""
    return normalize((p, p + 1) for p in points)


def subtract(runs: Iterable[Run], removed: Iterable[Run]) -> list[Run]:
    """Positions of `runs` that are not in `removed`."""
    cut = normalize(removed)
    out: list[Run] = []
    for a, b in normalize(runs):
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


def count(runs: Iterable[Run]) -> int:
    return sum(b - a for a, b in runs)


def positions(runs: Iterable[Run]) -> Iterable[int]:
    for a, b in runs:
        yield from range(a, b)


def cut(runs: Iterable[Run], size: int) -> list[list[Run]]:
    """Split runs into consecutive windows of `size` positions (the last may be smaller)."""
    if size < 1:
        raise ValueError("window size must be >= 1")
    windows: list[list[Run]] = []
    cur: list[Run] = []
    room = size
    for a, b in normalize(runs):
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


def contains(runs: list[Run], p: int) -> bool:
    """True when p is in the (normalized) runs."""
    i = bisect_right(runs, (p, float("inf"))) - 1  # type: ignore[arg-type]
    return i >= 0 and runs[i][0] <= p < runs[i][1]
