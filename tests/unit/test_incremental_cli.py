"""`sluice status` shows the lineage and the skip of an incremental run (S3 cases: tests/integration)."""

from __future__ import annotations

import io

from sluice.ops.status import render


def test_status_shows_the_lineage_and_the_skipped_keys() -> None:
    out = io.StringIO()
    render(
        {
            "run_id": "r",
            "status": "SUBMITTED",
            "lineage": ["b", "a"],
            "skipped": {"unchanged": 1200},
            "total_keys": 30,
            "shards_done": 0,
            "shards_total": 3,
            "shards_failed": 0,
            "keys_processed": 0,
            "keys_failed": 0,
        },
        out,
    )
    assert "since     b, a (incremental: skipped 1,200 unchanged)" in out.getvalue()
