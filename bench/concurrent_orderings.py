"""Concurrent delivery, many orderings: how often the run's ledger or outcome differs from Batch's order.

The four run shapes of tests/integration/test_completion_concurrent.py (a 7-shard array run and a
3-node MNP run, each with and without a shard failing for good, Spot and host losses retried)
have their full event sets delivered in random orders, each event 1-3 times, from 4 threads,
into the real completion handler on moto made atomic per request, with DynamoDB's two
concurrency behaviours: TransactionConflict, and BatchGetItem read item by item
(read-committed). Each ordering is compared with one sequential delivery in Batch's order.

Two readers of the run's counters, in the same run on the same orderings:
  ours      one TransactGetItems (serializable), as sluice.control.table.records reads them;
  baseline  one BatchGetItem, as they were read before (each item at its own moment).

    .venv/bin/python bench/concurrent_orderings.py --orderings 96 --baseline-orderings 24

A defect in 1 of 24 orderings is missed by n orderings with probability (23/24)**n: 1.7% at 96.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _batch_counts(self: Any, run_id: str) -> Any:
    """The counters summed from one BatchGetItem (the baseline reader)."""
    from sluice.control.table import records
    from sluice.control.table.ddb import item, values
    from sluice.control.table.items import Counts

    keys = [item({"pk": run_id, "sk": records.counter_sk(k)}) for k in range(records.COUNTER_SHARDS)]
    resp = self.client.batch_get_item(RequestItems={self.table: {"Keys": keys, "ConsistentRead": True}})
    total = Counts()
    for raw in resp["Responses"].get(self.table, []):
        c = records.CounterItem.model_validate(values(raw))
        for k in records._TOTALS:
            setattr(total, k, getattr(total, k) + getattr(c, k))
        for k, r in records._REASONS.items():
            if getattr(c, k):
                total.failed_by_reason[r] = total.failed_by_reason.get(r, 0) + getattr(c, k)
    return total


def _wrong(ref: dict[str, Any], got: dict[str, Any]) -> tuple[bool, bool]:
    """(ledger or outcome differs from Batch's order, a Run Progress above the run's shards)."""
    sc = got["sc"]
    over = any(p["shards_done"] > len(sc.fates) or p["shards_failed"] > len(sc.failed) for p in got["progress"])
    return got["view"] != ref["view"] or got["outcome"] != ref["outcome"], over


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--orderings", type=int, default=96, help="orderings per shape and reader")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--readers", default="ours,baseline")
    ap.add_argument("--baseline-orderings", type=int, default=None, help="the first N orderings only (default: all)")
    args = ap.parse_args()

    from _pytest.monkeypatch import MonkeyPatch

    logging.disable(logging.INFO)  # the handlers' INFO lines, thousands of them

    from sluice.control.table.records import ShardRecords
    from tests.integration import test_completion_concurrent as cc

    rng = random.Random(args.seed)
    orders = [(rng.sample(range(64), 64), [rng.randint(1, 3) for _ in range(64)]) for _ in range(args.orderings)]
    readers = args.readers.split(",")
    rows: dict[tuple[str, str], tuple[int, int, int]] = {}
    original = ShardRecords.counts
    for shape in sorted(cc.SHAPES):
        mp = MonkeyPatch()
        try:
            ref = cc._reference(mp, shape)
            for reader in readers:
                ShardRecords.counts = _batch_counts if reader == "baseline" else original  # type: ignore[method-assign]
                wrong = over = 0
                mine = orders[: args.baseline_orderings] if reader == "baseline" else orders
                for order, copies in mine:
                    w, o = _wrong(ref, cc._run(mp, shape, order, copies))
                    wrong, over = wrong + w, over + o
                rows[(shape, reader)] = (wrong, over, len(mine))
                print(f"{shape:<13} {reader:<9} wrong {wrong}/{len(mine)}, progress over total {over}", flush=True)
        finally:
            ShardRecords.counts = original  # type: ignore[method-assign]
            mp.undo()

    print()
    print(
        "| shape | wrong, ours (TransactGetItems) | wrong, baseline (BatchGetItem) "
        "| progress > total (ours / baseline) | wrong rate, ours / baseline |"
    )
    print("|---|---:|---:|---:|---:|")
    for shape in sorted(cc.SHAPES):
        ours = rows.get((shape, "ours"), (0, 0, 0))
        base = rows.get((shape, "baseline"), (0, 0, 0))
        rate = lambda r: r[0] / r[2] if r[2] else 0.0  # noqa: E731
        ratio = f"{rate(ours) / rate(base):.2f}" if rate(base) else "n/a (baseline 0)"
        print(f"| {shape} | {ours[0]}/{ours[2]} | {base[0]}/{base[2]} | {ours[1]} / {base[1]} | {ratio} |")


if __name__ == "__main__":
    main()
