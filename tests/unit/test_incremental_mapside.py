"""A map worker reading earlier output (sluice.prepare.mapper.versions) from a local folder: what counts, what not."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sluice.contracts.prepare import EarlierOutput, PrepareSpec
from sluice.prepare import prepare_store
from sluice.prepare.mapper.parts import TaskProblems
from sluice.prepare.mapper.versions import VersionRouter, committed_chunks, map_earlier
from sluice.prepare.reducer.skip import parse
from sluice.shards import ShardReader
from tests.integration.incremental_support import write_chunk


def _spec(tmp: Path, partitions: int = 2) -> PrepareSpec:
    return PrepareSpec(
        run_id="new",
        manifest_uri="s3://c/manifests/m.json",
        root=str(tmp / "new") + "/",
        workers=1,
        partitions=partitions,
        keys_per_shard=10,
        max_keys=100,
        tasks=[],
        since_run="old",
        lineage=["old"],
        model_ids=["mid-a", "mid-b"],
    )


def test_committed_chunks_are_those_with_a_marker(tmp_path: Path) -> None:
    store = prepare_store()
    d = str(tmp_path / "out" / "shard=0") + "/"
    write_chunk(store, d, "part-0000-000000000", [("s3://b/a", "e", None)], "m", "mid-a", "old")
    write_chunk(store, d, "part-0001-000000000", [("s3://b/b", "e", None)], "m", "mid-a", "old", committed=False)
    store.put(d + "_commits/part-0002-000000000.json", json.dumps({"file": None, "rows": 0}).encode())  # no rows
    assert [u for u, _ in committed_chunks(store, d)] == [d + "part-0000-000000000.parquet"]


def test_rows_of_other_models_and_unreadable_or_unversioned_files_count_for_nothing(tmp_path: Path) -> None:
    store = prepare_store()
    prefix = str(tmp_path / "old" / "output") + "/"
    d = prefix + "shard=0/"
    rows = [("s3://b/a.jpg", "ea", None), ("s3://b/b.jpg", "eb", "v1")]
    write_chunk(store, d, "part-0000-000000000", rows, "m", "mid-b", "old")
    write_chunk(store, d, "part-0000-000000002", rows, "m", "other-model", "old")
    legacy = pa.table({"key": ["s3://b/c.jpg"], "embedding": pa.array([[0.1, 0.2]], pa.list_(pa.float32(), 2))})
    buf = io.BytesIO()
    pq.write_table(legacy, buf)
    for name, data in (("part-0000-000000004", buf.getvalue()), ("part-0000-000000006", b"not parquet")):
        store.put(d + name + ".parquet", data)
        store.put(d + "_commits/" + name + ".json", b"{}")
    spec = _spec(tmp_path)
    sink = VersionRouter(str(tmp_path / "spill"), spec, store)
    problems = TaskProblems()
    task = EarlierOutput(run_id="old", rank=0, model_prefix=prefix, model_id="mid-b", start=0, stop=2)
    assert map_earlier(task, store, sink, problems) == 2
    sink.close()
    assert not problems.count
    c = sink.counts
    assert (c.earlier_files, c.earlier_rows, c.earlier_unversioned) == (4, 2, 2)
    recs = []
    for r, path in enumerate(sink.parts.paths):
        for bucket, keys in ShardReader(Path(path).read_bytes()).groups():
            recs += [(r, bucket, parse(k)) for k in keys]
    assert all(r >= spec.partitions for r, _, _ in recs), "earlier rows go to the second half of the files"
    assert sorted((b, p) for _, b, p in recs) == [
        ("b", ("a.jpg", 0, 1, "ea", None)),
        ("b", ("b.jpg", 0, 1, "eb", "v1")),
    ]
    assert sum(c.partition_records) == 2
