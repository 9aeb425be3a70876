"""Recall@10 of the ANN index (IVF-PQ, exact re-ranking) against exact search, on unseen data.

The vectors and queries come from seeds and topic directions used nowhere else (the
parameters were tuned on other data: bench/index.py); the queries are not in the index.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from sluice.index.build import build
from sluice.index.search import Searcher
from tests.index_support import clustered, exact_top, recall_at, uris, write_run


def test_an_ann_table_answers_unseen_queries_with_recall_095(tmp_path):
    n, dim = 24_000, 64  # just over MIN_ANN_ROWS: the smallest table with an ANN index
    x = clustered(n, dim, 11, centers=300, center_seed=101)
    write_run(str(tmp_path / "runs"), "r", uris(n), x, chunk_keys=4_000)
    report = build([str(tmp_path / "runs" / "r")], str(tmp_path / "idx"))
    assert report.ann == "IVF_PQ"
    searcher = Searcher.open(str(tmp_path / "idx"))
    queries = clustered(100, dim, 12, centers=300, center_seed=101)
    found = [[h.key for h in hits] for hits in searcher.search(queries, 10)]
    assert recall_at(found, exact_top(x.astype(np.float16), queries, 10), uris(n)) >= 0.95


# 30,000 rows: past MIN_ANN_ROWS, so IVF-PQ through the CLI, in seconds; recall at 100,000 and
# 1,000,000 rows is bench/index.py's (docs/performance.md, "Search index").
def test_30k_clustered_256d_float16_recall_at_10_through_the_cli(tmp_path):
    n, dim = 30_000, 256
    x = clustered(n, dim, 21, centers=300, center_seed=202)
    keys = uris(n)
    write_run(str(tmp_path / "runs"), "big", keys, x, shards=4, dtype="float16")
    cli = [sys.executable, "-m", "sluice.cli"]
    built = subprocess.run(
        [*cli, "index", "build", str(tmp_path / "runs" / "big"), "--out", str(tmp_path / "idx"), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    assert json.loads(built.stdout)["ann"] == "IVF_PQ"
    queries = clustered(200, dim, 22, centers=300, center_seed=202)
    np.save(tmp_path / "q.npy", queries)
    found = subprocess.run(
        [*cli, "search", str(tmp_path / "idx"), "--vector-file", str(tmp_path / "q.npy"), "-k", "10", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert found.returncode == 0, found.stderr[-2000:]
    results = json.loads(found.stdout)["results"]
    assert len(results) == 200
    keys_found = [[h["key"] for h in r] for r in results]
    assert recall_at(keys_found, exact_top(x.astype(np.float16), queries, 10), keys) >= 0.95
