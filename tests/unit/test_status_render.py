"""`sluice status` lines from a run's status dict: the kind's own words and its search command."""

from __future__ import annotations

import io

import pytest

from sluice.ops.status import render

BASE = {"run_id": "r1", "status": "SUCCEEDED", "total_keys": 10, "shards_done": 1, "shards_total": 1}
COUNTS = {"shards_failed": 0, "keys_processed": 9, "keys_failed": 1}
INDEX = {"index": {"uri": "s3://b/ix/", "state": "indexed", "rows": 40, "ann": "none"}}


@pytest.mark.parametrize(
    ("kind", "keys", "query"),
    [
        ("image", "images    [##############################] 10/10  (1 failed)", "--image FILE"),
        ("text", "documents [##############################] 10/10  (1 failed; 40 chunks)", "--text 'WORDS'"),
        ("video", "videos    [##############################] 10/10  (1 failed; 40 frames)", "--image FILE"),
        (
            "audio",
            "audio files [##############################] 10/10  (1 failed; 40 windows, 1,234.5 s of audio)",
            "--audio FILE",
        ),
    ],
)
def test_a_runs_lines_speak_of_its_kind_and_search_it_as_its_kind(kind, keys, query):
    out = io.StringIO()
    render({**BASE, **COUNTS, **INDEX, "kind": kind, "parts": 40, "media_s": 1234.5}, out)
    lines = out.getvalue().splitlines()
    assert keys in lines, lines
    assert f"search    sluice search s3://b/ix/ {query}" in lines, lines
