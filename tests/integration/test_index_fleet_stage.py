"""`python -m sluice.index stage train|segment|commit` end to end against local folders (sluice.index.fleet.stage).

The steps run in this process, as each AWS Batch job would run them one after another (the
array's children in any order, one of them twice, as a Batch retry does). ann.MIN_ANN_ROWS is
lowered, as SLUICE_INDEX_MIN_ANN_ROWS does for a process, so small tables get a real IVF-PQ index.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import lance
import pytest

from sluice.contracts.events import IndexFailed, RunIndexed
from sluice.index import ann
from sluice.index.__main__ import main
from sluice.index.fleet.files import FleetChild, child_uri, read_plan
from sluice.index.search import Searcher
from sluice.index.storage import Files
from sluice.paths import index_result
from tests.index_support import clustered, uris, write_run

DIM = 32


@pytest.fixture(autouse=True)
def small_ann(monkeypatch):
    monkeypatch.setattr(ann, "MIN_ANN_ROWS", 1_000)


def _step(step: str, root: Path, run: str, index: Path, *extra: str) -> int:
    return main(["stage", step, "--root", str(root / run), "--run", run, "--out", str(index), *extra])


def _child(monkeypatch, k: int, root: Path, run: str, index: Path) -> int:
    monkeypatch.setenv("AWS_BATCH_JOB_ARRAY_INDEX", str(k))
    return _step("segment", root, run, index)


def _result(index: Path, run: str) -> dict:
    return json.loads(Path(index_result(str(index), run)).read_text())


def test_train_segments_in_any_order_commit_writes_run_indexed(tmp_path, monkeypatch):
    n, runs, index = 6_000, tmp_path / "runs", tmp_path / "idx"
    x = clustered(n, DIM, 61, centers=60, center_seed=606)
    keys = uris(n)
    write_run(str(runs), "r", keys, x, chunk_keys=1_500)
    assert _step("train", runs, "r", index, "--children", "3") == 0
    assert not os.path.exists(index_result(str(index), "r"))  # train writes no outcome on success
    for k in (2, 0, 1, 0):  # any order; child 0 retried
        assert _child(monkeypatch, k, runs, "r", index) == 0
    assert _step("commit", runs, "r", index) == 0
    done = RunIndexed.model_validate(_result(index, "r"))
    assert (done.rows, done.ann, [t.rows for t in done.tables]) == (n, "IVF_PQ", [n])
    ds = lance.dataset(done.tables[0].uri)
    [idx] = [i for i in ds.describe_indices() if list(i.field_names) == ["embedding"]]
    assert idx.num_rows_indexed == n  # every row once
    version = ds.version
    assert _step("commit", runs, "r", index) == 0  # a rerun of commit: the same outcome, nothing twice
    assert RunIndexed.model_validate(_result(index, "r")).rows == n
    again = lance.dataset(done.tables[0].uri)
    assert [i.segments[0].uuid for i in again.describe_indices() if i.name == idx.name] == [idx.segments[0].uuid]
    assert again.version <= version + 1  # at most the key index's no-op optimize
    [hit] = Searcher.open(str(index)).search(x[7:8], 1)
    assert hit[0].key == keys[7]


def test_a_small_growth_extends_in_train_and_children_have_nothing_to_do(tmp_path, monkeypatch):
    runs, index = tmp_path / "runs", tmp_path / "idx"
    x = clustered(4_000, DIM, 71, centers=60, center_seed=707)
    keys = uris(4_000)
    write_run(str(runs), "a", keys[:3_000], x[:3_000], chunk_keys=1_000)
    write_run(str(runs), "b", keys[3_000:], x[3_000:], chunk_keys=1_000, created_at="2026-02-01T00:00:00+00:00")
    for run in ("a", "b"):
        assert _step("train", runs, run, index, "--children", "2") == 0
        for k in (0, 1):
            assert _child(monkeypatch, k, runs, run, index) == 0
        assert _step("commit", runs, run, index) == 0
    plan = read_plan(Files(), str(index) + "/", "b")
    assert [t.mode for t in plan.tables] == ["extended"]
    child = FleetChild.model_validate_json(Path(child_uri(str(index) + "/", "b", 1)).read_text())
    assert child.segments == []
    done = RunIndexed.model_validate(_result(index, "b"))
    ds = lance.dataset(done.tables[0].uri)
    [idx] = [i for i in ds.describe_indices() if list(i.field_names) == ["embedding"]]
    assert idx.num_rows_indexed == done.rows == 4_000
    [hit] = Searcher.open(str(index)).search(x[3_500:3_501], 1)
    assert hit[0].key == keys[3_500]


def test_a_failed_child_and_commit_write_index_failed_and_the_previous_version_stays(tmp_path, monkeypatch):
    runs, index = tmp_path / "runs", tmp_path / "idx"
    x = clustered(10_000, DIM, 81, centers=60, center_seed=808)
    keys = uris(10_000)
    write_run(str(runs), "a", keys[:2_000], x[:2_000], chunk_keys=1_000)
    write_run(str(runs), "b", keys[2_000:], x[2_000:], chunk_keys=2_000, created_at="2026-02-01T00:00:00+00:00")
    assert main(["build", str(runs / "a"), "--out", str(index)]) == 0  # the index before: 2,000 rows, IVF-PQ
    uri = str(index / "reference-cnn.lance")
    before = lance.dataset(uri)
    assert _step("train", runs, "b", index, "--children", "2") == 0  # 5x the rows: retrained by the stages
    [t] = read_plan(Files(), str(index) + "/", "b").tables
    assert t.mode == "segments"
    old = {f.fragment_id for f in before.get_fragments()}
    victim = next(f for f in t.shares[1] if f not in old)  # a fragment of run b's rows, child 1's
    frag = lance.dataset(uri, version=t.version).get_fragment(victim)
    assert frag is not None
    for data in frag.data_files():  # a real fault: the fragment's file is gone
        os.remove(os.path.join(uri, "data", data.path))
    assert _child(monkeypatch, 0, runs, "b", index) == 0
    assert _child(monkeypatch, 1, runs, "b", index) == 1
    failed = IndexFailed.model_validate(_result(index, "b"))
    assert failed.reason.startswith("segment child 1 of 2: ") and "not found" in failed.reason.lower()
    assert _step("commit", runs, "b", index) == 1
    assert IndexFailed.model_validate(_result(index, "b")).reason.startswith(
        f"commit: {uri}: segment child 1 of 2 has not indexed its fragments"
    )
    assert lance.dataset(uri).version == t.version  # nothing committed
    previous = lance.dataset(uri, version=before.version)
    [hit] = (
        previous.to_table(columns=["key"], nearest={"column": "embedding", "q": x[5], "k": 1}).column("key").to_pylist()
    )
    assert hit == keys[5] and previous.count_rows() == 2_000


def test_a_train_that_fails_writes_index_failed(tmp_path):
    runs, index = tmp_path / "runs", tmp_path / "idx"
    x = clustered(5, DIM, 91)
    write_run(str(runs), "e", [], x, uncommitted=5)  # only a killed attempt's chunk: nothing committed
    assert _step("train", runs, "e", index, "--children", "2") == 1
    failed = IndexFailed.model_validate(_result(index, "e"))
    assert failed.reason.startswith("train: no committed output rows")


def test_two_models_are_two_tables_each_child_indexes_its_share_of_both(tmp_path, monkeypatch):
    from sluice.contracts.sections import ModelSpec

    runs, index = tmp_path / "runs", tmp_path / "idx"
    specs = [ModelSpec(name="small"), ModelSpec(uri="builtin:reference-cnn-large", name="big")]
    keys = uris(3_000)
    per = {"small": clustered(3_000, DIM, 1, centers=40), "big": clustered(3_000, 48, 2, centers=40)}
    write_run(str(runs), "m", keys, per["small"], models=specs, per_model=per, chunk_keys=500)
    assert _step("train", runs, "m", index, "--children", "2") == 0
    plan = read_plan(Files(), str(index) + "/", "m")
    assert sorted(t.model for t in plan.tables) == ["big", "small"] and all(all(t.shares) for t in plan.tables)
    for k in (1, 0):
        assert _child(monkeypatch, k, runs, "m", index) == 0
    child = FleetChild.model_validate_json(Path(child_uri(str(index) + "/", "m", 1)).read_text())
    assert sorted(s.table for s in child.segments) == sorted(t.uri for t in plan.tables)  # one segment a table
    assert _step("commit", runs, "m", index) == 0
    done = RunIndexed.model_validate(_result(index, "m"))
    assert sorted((t.model, t.rows, t.ann) for t in done.tables) == [
        ("big", 3_000, "IVF_PQ"),
        ("small", 3_000, "IVF_PQ"),
    ]
    for t in done.tables:
        [idx] = [i for i in lance.dataset(t.uri).describe_indices() if list(i.field_names) == ["embedding"]]
        assert idx.num_rows_indexed == 3_000
