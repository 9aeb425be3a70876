"""How a distributed index build spreads a table over its segment children: fragments, bounded and dealt.

A child indexes whole Lance fragments (create_index_uncommitted takes fragment ids), so a table
needs several fragments a child for the children's rows to be even. A merge writes its new rows
as fragments of up to Lance's 1,048,576 rows; before training, the fragments no index covers yet
that are bigger than `fragment_rows` are rewritten smaller (one Rewrite commit). Fragments an
index covers are never rewritten: the index's row addresses point into them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

from sluice.index.storage import storage_options

# About 8 fragments a child: a greedy deal is within one fragment of even (<= 1/8 of a share).
FRAGMENTS_PER_CHILD = 8
MIN_FRAGMENT_ROWS = 1_000  # smaller fragments only add manifest entries and files
LANCE_FILE_ROWS = 1_048_576  # Lance's max_rows_per_file: what a merge's fragments hold at most


def fragment_rows(rows: int, children: int) -> int:
    """The most rows a fragment may hold for `children` children to get about FRAGMENTS_PER_CHILD each."""
    want = math.ceil(rows / (max(1, children) * FRAGMENTS_PER_CHILD))
    return max(MIN_FRAGMENT_ROWS, min(LANCE_FILE_ROWS, want))


def deal(fragments: Sequence[tuple[int, int]], children: int) -> list[list[int]]:
    """(fragment id, rows) dealt to `children` shares: disjoint, each once, largest first to the lightest share.

    The heaviest share exceeds the lightest by at most the biggest fragment (list scheduling).
    """
    shares: list[list[int]] = [[] for _ in range(children)]
    heap = [(0, k) for k in range(children)]
    for fid, rows in sorted(fragments, key=lambda f: (-f[1], f[0])):
        load, k = heapq.heappop(heap)
        shares[k].append(fid)
        heapq.heappush(heap, (load + rows, k))
    return [sorted(s) for s in shares]


def split_fragments(ds: Any, bound: int) -> Any:
    """Rewrite the unindexed fragments over `bound` rows as fragments of at most `bound`; the dataset after."""
    import lance
    from lance import LanceOperation

    covered: set[int] = set()
    for idx in ds.describe_indices():
        for seg in idx.segments:
            covered.update(int(f) for f in seg.fragment_ids)
    big = [f for f in ds.get_fragments() if f.fragment_id not in covered and f.count_rows() > bound]
    if not big:
        return ds
    opts = storage_options(ds.uri)
    groups = []
    for frag in big:  # streamed: a fragment is up to ~1M rows
        reader = frag.scanner(batch_size=8_192).to_reader()
        new = lance.fragment.write_fragments(
            reader, ds.uri, schema=ds.schema, max_rows_per_file=bound, storage_options=opts
        )
        groups.append(LanceOperation.RewriteGroup([frag.metadata], new))
    op = LanceOperation.Rewrite(groups=groups, rewritten_indices=[])
    return lance.LanceDataset.commit(ds.uri, op, read_version=ds.version, storage_options=opts)
