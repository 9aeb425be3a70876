"""The read recipe (docs/incremental.md) on the output files of a full run and an incremental run on it.

Run A embeds an image set with two models (one image fails); the images change (some edited,
one removed, some added); run B, incremental on A, goes through the real prepare stage, and a
worker stand-in writes B's output for exactly the keys of B's shards. The recipe, run by
duckdb over both runs' files, must return one row per (key, model) for every key of B's
input, each of its current version, plus the removed key's row from A (the documented
behaviour); a killed attempt's leftover chunk in A's output must not add a duplicate.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import duckdb
import pytest
from moto import mock_aws

from sluice.cli import main
from sluice.contracts.prepare import PrefixRange, PrepareSpec
from sluice.contracts.sections import ModelSpec
from sluice.control.intake.lineage import EarlierRun, Lineage
from sluice.ops.recipe import Source, recipe_sql
from sluice.paths import RunPaths, shard_output_dir
from sluice.prepare import prepare_store
from sluice.prepare.collect import collect
from sluice.prepare.reducer.versions import place_shards
from sluice.shards import ShardReader
from tests.integration.incremental_support import earlier_plan, md5, run_prepare, write_chunk, write_output

IMAGES = "imgs"
MODELS = [
    (ModelSpec(uri="builtin:reference-cnn"), "builtin:reference-cnn@1"),
    (ModelSpec(uri="builtin:reference-cnn-large"), "builtin:reference-cnn-large@1"),
]
IDS = [mid for _, mid in MODELS]


def _put(s3: Any, key: str, version: str) -> str:
    body = f"{key}:{version}".encode()
    s3.put_object(Bucket=IMAGES, Key=key, Body=body)
    return md5(body)


def _uri(k: str) -> str:
    return f"s3://{IMAGES}/{k}"


@pytest.fixture
def s3() -> Any:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=IMAGES)
        yield client


def _incremental_shards(s3: Any, tmp: Path, a: Any) -> tuple[Any, list[str]]:
    """Run B's prepare stage (since A) over the prefix; returns its plan and the keys its shards hold."""
    lineage = Lineage([EarlierRun("run-a", a, a.n_shards)])
    root = str(tmp / "runs" / "run-b") + "/"
    spec = PrepareSpec(
        run_id="run-b",
        manifest_uri="s3://ctl/manifests/b.json",
        root=root,
        workers=2,
        partitions=2,
        keys_per_shard=5,
        max_keys=10**6,
        tasks=[PrefixRange(bucket=IMAGES, prefix="set/")],
        since_run="run-a",
        lineage=lineage.ids,
        model_ids=IDS,
        earlier=lineage.tasks(IDS, 2),
    )
    store = prepare_store(s3)
    run_prepare(store, spec)
    got = collect(spec, store)
    assert got.rejected is None, got.rejected
    place_shards(spec, got.pieces, store)
    b = earlier_plan("run-b", root, MODELS, n_shards=got.n_shards, total_keys=got.unique_keys, lineage=["run-a"])
    keys = [k for i in range(got.n_shards) for _, k in ShardReader(store.get(RunPaths(root).shard(i))).pairs()]
    return b, keys


def test_the_recipe_reads_a_run_and_its_lineage_as_one_complete_duplicate_free_set(s3, tmp_path, capsys) -> None:
    names = [f"set/{i:02d}.jpg" for i in range(16)]
    v1 = {k: _put(s3, k, "v1") for k in names}
    store = prepare_store(s3)
    a = earlier_plan("run-a", str(tmp_path / "runs" / "run-a") + "/", MODELS, n_shards=2, total_keys=16)
    failed_in_a = names[15]
    write_output(store, a, [[(_uri(k), v1[k], None) for k in names if k != failed_in_a]] * 2)
    leftover = shard_output_dir(a.model_output_prefix(0), 0)  # a killed attempt's duplicate of names[0]
    write_chunk(
        store,
        leftover,
        "part-0003-000000000",
        [(_uri(names[0]), v1[names[0]], None)],
        "x",
        IDS[0],
        "run-a",
        committed=False,
    )
    edited, removed, added = names[:4], names[4], [f"set/new-{i}.jpg" for i in range(3)]
    current = dict(v1) | {k: _put(s3, k, "v2") for k in edited} | {k: _put(s3, k, "v1") for k in added}
    s3.delete_object(Bucket=IMAGES, Key=removed)
    del current[removed]

    b, b_keys = _incremental_shards(s3, tmp_path, a)
    assert sorted(b_keys) == sorted([*edited, failed_in_a, *added]), "B embeds the changed, failed and new keys"
    write_output(store, b, [[(_uri(k), current[k], None) for k in b_keys]] * 2)  # the worker stand-in

    sql = recipe_sql([Source.of(b), Source.of(a)], [m.model_id for m in b.models])
    rows = duckdb.sql(sql).fetchall()
    cols = [d[0] for d in duckdb.sql(sql).description]
    got = [dict(zip(cols, r, strict=True)) for r in rows]
    pairs = Counter((r["key"], r["model_id"]) for r in got)
    assert max(pairs.values()) == 1, "no duplicates: one row per (key, model)"
    for mid in IDS:
        keys = {r["key"] for r in got if r["model_id"] == mid}
        assert keys == {_uri(k) for k in [*current, removed]}, "complete: every key, the removed one from A"
    for r in got:
        name = r["key"].removeprefix(f"s3://{IMAGES}/")
        if name == removed:
            assert r["run"] == "run-a" and r["etag"] == v1[removed]
            continue
        assert r["etag"] == current[name], f"{name}: the embedding of its current version"
        assert r["run"] == ("run-b" if name in b_keys else "run-a")
    assert {r["model"] for r in got} == {"reference-cnn", "reference-cnn-large"}

    # `sluice output sql RUN --local DIR` on a local copy (committed chunks only, plans next to them).
    Path(leftover, "part-0003-000000000.parquet").unlink()
    (tmp_path / "runs" / "run-a" / "plan.json").write_text(a.model_dump_json())
    (tmp_path / "runs" / "run-b" / "plan.json").write_text(b.model_dump_json())
    assert main(["output", "sql", "run-b", "--local", str(tmp_path / "runs")]) == 0
    printed = capsys.readouterr().out
    assert "_commits" not in printed and "run-b', 0), ('run-a', 1)" in printed
    assert sorted(duckdb.sql(printed).fetchall()) == sorted(rows)
