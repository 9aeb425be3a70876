"""`sluice index build --workers N` (sluice.index.fleet.workers): trained once, segments in N processes, one commit."""

from __future__ import annotations

import json
import os

import lance
import numpy as np
import pytest

from sluice.index.__main__ import main
from sluice.index.build import build
from sluice.index.fleet import workers
from sluice.index.fleet.build import train
from sluice.index.search import Searcher
from sluice.index.table import IndexTable
from sluice.paths import fleet_path
from tests.index_support import clustered, exact_top, recall_at, uris, write_run

pytestmark = pytest.mark.subprocess  # the build spawns worker processes

N, DIM = 24_000, 64


def _recall(index: str, x: np.ndarray, queries: np.ndarray, keys: list[str]) -> float:
    found = [[h.key for h in hits] for hits in Searcher.open(index).search(queries, 10)]
    return recall_at(found, exact_top(x.astype(np.float16), queries, 10), keys)


def _ann(uri: str):
    table = IndexTable.open(uri)
    assert table is not None
    [idx] = [i for i in table.dataset.describe_indices() if list(i.field_names) == ["embedding"]]
    return table, idx


def test_two_workers_match_the_single_builds_recall_and_index_every_row_once(tmp_path):
    x = clustered(N, DIM, 31, centers=300, center_seed=303)
    keys = uris(N)
    write_run(str(tmp_path / "runs"), "r", keys, x, chunk_keys=4_000)
    single = build([str(tmp_path / "runs" / "r")], str(tmp_path / "one"))
    fleet = workers.build([str(tmp_path / "runs" / "r")], str(tmp_path / "two"), workers=2)
    assert single.ann == fleet.ann == "IVF_PQ"
    assert [c["child"] for c in fleet.children] == [0, 1] and all(c["rows"] > 0 for c in fleet.children)
    table, idx = _ann(fleet.tables[0].uri)
    assert idx.num_rows_indexed == table.count_rows() == N == sum(c["rows"] for c in fleet.children)
    assert len(idx.segments) == 1  # the children's two segments, merged at commit
    queries = clustered(100, DIM, 32, centers=300, center_seed=303)  # unseen: not in the index
    r1 = _recall(str(tmp_path / "one"), x, queries, keys)
    r2 = _recall(str(tmp_path / "two"), x, queries, keys)
    assert r1 >= 0.95 and abs(r1 - r2) <= 0.005, (r1, r2)
    work = fleet_path(str(tmp_path / "two"), "")
    assert os.listdir(work) == [], "the local work files are removed"


def test_an_index_built_by_workers_is_extended_by_the_single_build_newest_row_wins(tmp_path, capsys):
    x = clustered(N, DIM, 41, centers=300, center_seed=404)
    keys = uris(N)
    write_run(str(tmp_path / "runs"), "a", keys, x, chunk_keys=4_000)
    assert (
        main(["build", str(tmp_path / "runs" / "a"), "--out", str(tmp_path / "idx"), "--workers", "2", "--json"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert (report["rows"], report["ann"], len(report["children"])) == (N, "IVF_PQ", 2)
    moved = clustered(50, DIM, 42, centers=300, center_seed=405)  # 50 keys get new vectors elsewhere
    write_run(str(tmp_path / "runs"), "b", keys[:50], moved, chunk_keys=50, created_at="2026-02-01T00:00:00+00:00")
    build([str(tmp_path / "runs" / "b")], str(tmp_path / "idx"))  # small growth: optimize_indices extends it
    table, idx = _ann(report["tables"][0]["uri"])
    assert idx.num_rows_indexed == table.count_rows() == N  # replaced rows indexed, not added twice
    hits = Searcher.open(str(tmp_path / "idx")).search(moved[:5], 1)
    assert [h[0].key for h in hits] == keys[:5]


def test_a_failed_worker_fails_the_build_naming_it_and_commits_nothing(tmp_path):
    x = clustered(N, DIM, 51, centers=300, center_seed=505)
    write_run(str(tmp_path / "runs"), "a", uris(N), x, chunk_keys=4_000)
    index = str(tmp_path / "idx") + "/"
    plan = train([str(tmp_path / "runs" / "a")], index, "local-t", 2)
    [t] = plan.tables
    before = lance.dataset(t.uri)
    frag = before.get_fragment(t.shares[1][0])
    assert frag is not None
    for data in frag.data_files():  # a real fault: child 1's fragment file is gone
        os.remove(os.path.join(t.uri, "data", data.path))
    with pytest.raises(workers.WorkerFailed, match=r"worker 1 of 2 \(fragments \[\[.*\]\]\): .*Not ?found"):
        workers.run_children(index, "local-t", 2)
    after = lance.dataset(t.uri)
    assert after.version == t.version and not [i for i in after.describe_indices() if "embedding" in i.field_names]
    previous = lance.dataset(t.uri, version=1)  # the table before this build: readable as it was
    assert previous.count_rows() == 0


def test_a_workers_builds_report_gives_the_stages_own_times(tmp_path, capsys):
    x = clustered(N, DIM, 51, centers=300, center_seed=505)
    write_run(str(tmp_path / "runs"), "r", uris(N), x, chunk_keys=4_000)
    out = str(tmp_path / "idx")
    assert main(["build", str(tmp_path / "runs" / "r"), "--out", out, "--workers", "2", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    (t,) = s["tables"]
    assert t["ann"] == "IVF_PQ" and t["merge_s"] > 0 and t["index_s"] > 0
    # the stages' times: merge, then train + the slowest segment child + commit, within the build's wall time
    assert t["index_s"] >= max(c["seconds"] for c in s["children"])
    assert t["merge_s"] + t["index_s"] <= s["seconds"] + 0.01
