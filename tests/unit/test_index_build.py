"""sluice.index: a run's committed output -> one Lance table per model, newest row per (key, model_id).

Runs are written with the worker's own Parquet writer and commit markers (tests/index_support.py).
Tables here stay under MIN_ANN_ROWS (exact search); the ANN path is in test_index_recall.py.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import lance
import numpy as np
import pyarrow.parquet as pq
import pytest

from sluice.contracts.sections import ModelSpec
from sluice.index.build import EmptySource, build
from sluice.index.search import Searcher
from sluice.index.sources import IndexBuildError
from tests.index_support import clustered, exact_top, recall_at, uris, write_run

DIM = 32


def _rows(index: Path, model: str = "reference-cnn") -> dict[str, dict]:
    table = lance.dataset(str(index / f"{model}.lance")).to_table()
    return {r["key"]: r for r in table.to_pylist()}


def test_a_run_is_indexed_without_its_uncommitted_chunk_and_searched_exactly(tmp_path):
    keys, x = uris(3000), clustered(3000, DIM, 1)
    write_run(str(tmp_path / "runs"), "r1", keys, x, chunk_keys=700, uncommitted=25)
    report = build([str(tmp_path / "runs" / "r1")], str(tmp_path / "idx"))

    rows = _rows(tmp_path / "idx")
    assert set(rows) == set(keys)  # not one of the 25 rows without a commit marker
    assert report.rows == 3000 and report.ann == "none"
    [t] = report.tables
    assert (t.model, t.model_id, t.dim, t.inserted, t.merged) == (
        "reference-cnn",
        "builtin:reference-cnn@1;image_size=224",
        DIM,
        3000,
        ["r1"],
    )
    row = rows[keys[7]]
    assert row["run"] == "r1" and row["model"] == "reference-cnn" and row["size"] is not None
    assert row["run_order"] == "2026-01-01T00:00:00+00:00"

    searcher = Searcher.open(str(tmp_path / "idx"))
    assert searcher.describe() | {"table": ""} == {
        "table": "",
        "model": "reference-cnn",
        "model_id": "builtin:reference-cnn@1;image_size=224",
        "dim": DIM,
        "dtype": "float16",
        "rows": 3000,
        "ann": "none",
    }
    queries = clustered(40, DIM, 99)  # unseen
    found = [[h.key for h in hits] for hits in searcher.search(queries, 10)]
    assert recall_at(found, exact_top(x.astype(np.float16), queries, 10), keys) == 1.0  # no ANN: exact
    [hits] = searcher.search(searcher.vector_of(keys[5]), 3)
    assert hits[0].key == keys[5] and hits[0].score == pytest.approx(1.0, abs=1e-3)
    assert searcher.vector_of("s3://images/nope.jpg") is None


def test_incremental_run_updates_the_lineage_index_newest_row_wins(tmp_path):
    runs, idx = tmp_path / "runs", tmp_path / "idx"
    old_keys, x1 = uris(1000), clustered(1000, DIM, 1)
    write_run(str(runs), "r1", old_keys, x1, created_at="2026-01-01T00:00:00+00:00")
    build([str(runs / "r1")], str(idx))
    changed = old_keys[500:] + uris(500, "new")
    x2 = clustered(1000, DIM, 2)
    write_run(str(runs), "r2", changed, x2, created_at="2026-01-02T00:00:00+00:00", lineage=["r1"])

    report = build([str(runs / "r2")], str(idx))
    [t] = report.tables
    assert (t.inserted, t.updated, t.merged, t.skipped) == (500, 500, ["r2"], ["r1"])  # r1: held already
    rows = _rows(idx)
    assert len(rows) == 1500
    assert {rows[k]["run"] for k in old_keys[:500]} == {"r1"} and {rows[k]["run"] for k in changed} == {"r2"}
    got = np.asarray(rows[changed[0]]["embedding"], dtype=np.float32)
    assert np.abs(got - x2[0]).max() < 1e-3  # r2's vector, not r1's

    # A fresh index from r2 reads its lineage too (r1, then r2): the same rows.
    (idx / "reference-cnn.lance").rename(tmp_path / "kept.lance")
    assert sorted(build([str(runs / "r2")], str(idx)).tables[0].merged) == ["r1", "r2"]
    fresh = _rows(idx)
    assert {k: v["run"] for k, v in fresh.items()} == {k: v["run"] for k, v in rows.items()}
    # A late retry of r1's index stage changes nothing: the table holds r1, and r2's rows are newer.
    again = build([str(runs / "r1")], str(idx))
    assert again.tables[0].skipped == ["r1"] and _rows(idx) == fresh


def test_the_index_holds_what_sluice_output_sql_reads(tmp_path):
    """The rows of a lineage's index are exactly the recipe's (duckdb, commit markers honoured)."""
    duckdb = pytest.importorskip("duckdb")
    from sluice.ops.recipe import Source, recipe_sql

    runs = tmp_path / "runs"
    a, b = uris(800), uris(800)[300:] + uris(200, "b")
    p1 = write_run(str(runs), "r1", a, clustered(800, DIM, 1), uncommitted=5)
    p2 = write_run(str(runs), "r2", b, clustered(700, DIM, 2), created_at="2026-02-01T00:00:00+00:00", lineage=["r1"])
    build([str(runs / "r2")], str(tmp_path / "idx"))
    sql = recipe_sql([Source.of(p2), Source.of(p1)], [p2.model.model_id])
    want = set(duckdb.sql(f"SELECT key, run FROM ({sql})").fetchall())
    got = {(k, v["run"]) for k, v in _rows(tmp_path / "idx").items()}
    assert got == want and len(got) == 1000


def test_retried_builds_give_the_same_table(tmp_path):
    keys, x = uris(900), clustered(900, DIM, 3)
    write_run(str(tmp_path / "runs"), "r1", keys, x)
    build([str(tmp_path / "runs" / "r1")], str(tmp_path / "idx"))
    first = _rows(tmp_path / "idx")
    report = build([str(tmp_path / "runs" / "r1")], str(tmp_path / "idx"))
    assert report.tables[0].skipped == ["r1"] and _rows(tmp_path / "idx") == first

    files = sorted(str(p) for p in (tmp_path / "runs").rglob("part-*.parquet"))
    for _ in range(2):  # Parquet files taken as they are, twice: replaced, not doubled
        build(files, str(tmp_path / "loose"))
    loose = _rows(tmp_path / "loose")
    assert len(loose) == 900 and {k: v["embedding"] for k, v in loose.items()} == {
        k: v["embedding"] for k, v in first.items()
    }


def test_two_builds_committing_at_once_lose_and_double_nothing(tmp_path):
    runs, idx = tmp_path / "runs", str(tmp_path / "idx")
    shared = uris(1500)
    write_run(str(runs), "r1", shared, clustered(1500, DIM, 1), created_at="2026-01-01T00:00:00+00:00")
    write_run(
        str(runs), "r2", shared[500:] + uris(300, "x"), clustered(1300, DIM, 2), created_at="2026-01-03T00:00:00+00:00"
    )
    errors: list[BaseException] = []

    def go(run: str) -> None:
        try:
            build([str(runs / run)], idx)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(r,)) for r in ("r1", "r2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    rows = _rows(tmp_path / "idx")
    table = lance.dataset(idx + "/reference-cnn.lance")
    assert table.count_rows() == len(rows) == 1800  # no key twice
    assert {rows[k]["run"] for k in shared[:500]} == {"r1"}
    assert {rows[k]["run"] for k in shared[500:]} == {"r2"}  # newest wins whichever committed last


def _loose(tmp_path: Path, name: str, n: int, dim: int, model: ModelSpec, seed: int) -> list[str]:
    write_run(str(tmp_path / name), "r", uris(n, name), clustered(n, dim, seed), models=[model], shards=1)
    return sorted(str(p) for p in (tmp_path / name).rglob("part-*.parquet"))


def test_mixed_dimensions_or_models_are_refused_naming_both(tmp_path):
    a = _loose(tmp_path, "a", 50, DIM, ModelSpec(), 1)
    b = _loose(tmp_path, "b", 50, 16, ModelSpec(), 2)
    with pytest.raises(IndexBuildError) as exc:
        build(a + b, str(tmp_path / "idx"))
    msg = str(exc.value)
    assert b[0] in msg and f"{DIM}-d" in msg and "16-d" in msg and "reference-cnn" in msg
    assert (
        not (tmp_path / "idx" / "reference-cnn.lance").exists()
        or lance.dataset(str(tmp_path / "idx" / "reference-cnn.lance")).count_rows() == 0
    )  # nothing committed

    c = _loose(tmp_path, "c", 50, DIM, ModelSpec(uri="builtin:reference-cnn-large", name="reference-cnn"), 3)
    build(a, str(tmp_path / "idx2"))
    with pytest.raises(IndexBuildError) as exc:
        build(c, str(tmp_path / "idx2"))  # same name, another artifact: not into this table
    assert "builtin:reference-cnn-large@1" in str(exc.value) and "builtin:reference-cnn@1" in str(exc.value)


def test_an_empty_run_writes_no_index(tmp_path):
    write_run(str(tmp_path / "runs"), "r0", [], np.zeros((0, DIM), np.float32))
    with pytest.raises(EmptySource, match="no committed output rows"):
        build([str(tmp_path / "runs" / "r0")], str(tmp_path / "idx"))
    assert not (tmp_path / "idx").exists()


def test_a_corrupt_parquet_file_is_named_and_the_table_left_as_it_was(tmp_path):
    keys = uris(1200)
    write_run(str(tmp_path / "runs"), "r1", keys, clustered(1200, DIM, 1), chunk_keys=300)
    build([str(tmp_path / "runs" / "r1")], str(tmp_path / "idx"))
    before = _rows(tmp_path / "idx")
    write_run(str(tmp_path / "runs"), "r2", keys, clustered(1200, DIM, 2), chunk_keys=300, lineage=["r1"])
    victim = sorted((tmp_path / "runs" / "r2").rglob("part-*.parquet"))[-1]
    victim.write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(IndexBuildError, match=str(victim)):
        build([str(tmp_path / "runs" / "r2")], str(tmp_path / "idx"))
    assert _rows(tmp_path / "idx") == before


def test_several_models_get_a_table_each_and_model_picks_one(tmp_path):
    specs = [ModelSpec(name="small"), ModelSpec(uri="builtin:reference-cnn-large", name="big")]
    keys = uris(400)
    per = {"small": clustered(400, DIM, 1), "big": clustered(400, 48, 2)}
    write_run(str(tmp_path / "runs"), "r1", keys, per["small"], models=specs, per_model=per)
    report = build([str(tmp_path / "runs" / "r1")], str(tmp_path / "idx"))
    assert sorted((t.model, t.dim, t.rows) for t in report.tables) == [("big", 48, 400), ("small", DIM, 400)]
    only = build([str(tmp_path / "runs" / "r1")], str(tmp_path / "one"), model="big")
    assert [t.model for t in only.tables] == ["big"]
    with pytest.raises(IndexBuildError, match="no model 'nope'"):
        build([str(tmp_path / "runs" / "r1")], str(tmp_path / "one"), model="nope")
    assert pq.read_schema(sorted((tmp_path / "runs").rglob("part-*.parquet"))[0]).metadata  # worker-written files


def test_parquet_files_holding_a_key_twice_are_refused(tmp_path):
    files = _loose(tmp_path, "a", 40, DIM, ModelSpec(), 1)
    copy = tmp_path / "copy.parquet"
    copy.write_bytes(Path(files[0]).read_bytes())
    with pytest.raises(IndexBuildError, match=re.escape("hold the key s3://images/a-0000000.jpg twice")):
        build([files[0], str(copy)], str(tmp_path / "idx"))
    assert not (tmp_path / "idx").exists()  # nothing written
