"""Chunk commits, markers, resume state and the end-of-shard check (local store: no S3 needed)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from gpu_worker.errors import WorkerError
from gpu_worker.output.commits import Marker, Paths, ShardState, load_state, remove_orphans
from gpu_worker.output.parquet import RecordLabel
from gpu_worker.output.result import write_shard_result
from gpu_worker.output.sink import ChunkSink, SinkSpec
from sluice import outputs
from sluice.aws.store import ObjectStore
from sluice.contracts.results import FailureLine, ShardResult
from sluice.contracts.status import FailureReason

# The fields of result.json only the node knows (gpu_worker.main fills them in).
INFO = {
    "run_id": "r",
    "shard": 3,
    "node": 3,
    "attempt": 1,
    "kind": "array",
    "device": "cpu",
    "world": 1,
    "seconds": 1.5,
    "pipeline_seconds": 1.0,
    "pipeline_window": [],
    "resumed_chunks": 0,
    "stats": {},
}


@pytest.fixture
def paths(tmp_path):
    return Paths.for_shard(f"{tmp_path}/out/", f"{tmp_path}/failures/", f"{tmp_path}/shards/", 3)


LABEL = RecordLabel("m", "v1", "sha256:abc", "r")


def sink(paths, windows, attempt=1, chunk_keys=10, rank=5, retry=(), timed=False):
    spec = SinkSpec(
        rank=rank,
        attempt=attempt,
        windows=windows,
        chunk_keys=chunk_keys,
        dtype="float16",
        metadata={"model": "m"},
        label=LABEL,
        retry=retry,
        timed=timed,
    )
    return ChunkSink(ObjectStore(), paths, spec)


def emb(*rows: int) -> np.ndarray:
    out = np.zeros((len(rows), 4), np.float32)
    for i, r in enumerate(rows):
        out[i, r % 4] = 1.0
    return out


def objs(*rows: int) -> list[tuple[str, str | None, int]]:
    """The (etag, version id, size) each row's object was read as."""
    return [(f"etag{r}", None, 100 + r) for r in rows]


def test_windows_commit_when_settled_in_any_order(paths):
    s = sink(paths, [[(0, 3)], [(3, 5), (8, 9)]])
    s.add_rows([4, 8], ["u4", "u8"], [0, 0], emb(4, 8), objs(4, 8))
    s.add_failure(1, "u1", 0, "corrupt", "bad", False)
    s.add_rows([3, 0], ["u3", "u0"], [0, 0], emb(3, 0), objs(3, 0))  # window 2 complete here (3, 4, 8)
    s.add_rows([2], ["u2"], [0], emb(2), objs(2))
    s.close()
    state = load_state(ObjectStore(), paths)
    names = [m.name for m in state.markers]
    assert names == ["part-0005-000000000", "part-0005-000000003"]
    first, second = state.markers
    assert first.covers == [(0, 3)] and first.rows == 2 and first.failed[0]["reason"] == "corrupt"
    assert second.covers == [(3, 5), (8, 9)] and second.rows == 3
    table = pq.read_table(paths.parquet(second.name))
    assert table.column("key").to_pylist() == ["u3", "u4", "u8"]  # sorted by shard position
    np.testing.assert_array_equal(np.stack(table.column("embedding").to_numpy(zero_copy_only=False)), emb(3, 4, 8))
    assert table.schema.metadata[b"sluice.model"] == b"m"


def test_deferred_keys_go_to_a_retry_chunk(paths):
    s = sink(paths, [[(0, 4)]], attempt=2)
    s.add_rows([0, 1], ["u0", "u1"], [0, 0], emb(0, 1), objs(0, 1))
    s.add_failure(2, "u2", 0, "s3_error_transient", "SlowDown", True)
    s.add_failure(3, "u3", 0, "s3_error_transient", "SlowDown", True)
    s.add_rows([2], ["u2"], [1], emb(2), objs(2))  # the final pass recovered u2
    s.add_failure(3, "u3", 1, "s3_error_transient", "SlowDown", True)  # deferred again: ignored
    s.add_failure(3, "u3", 1, "s3_error_transient", "SlowDown", False)  # final verdict
    s.close()
    state = load_state(ObjectStore(), paths)
    rng, retry = state.markers
    assert rng.kind == "range" and rng.covers == [(0, 2)] and rng.deferred == [(2, "u2"), (3, "u3")]
    assert retry.name == "part-0005-000000002-r2" and retry.kind == "retry"
    assert retry.covers == [(2, 4)] and retry.rows == 1 and [f["key"] for f in retry.failed] == ["u3"]
    assert state.pending_retry() == []
    assert state.covered == [(0, 4)]


def test_resume_state_from_markers():
    m1 = Marker("a", "range", 3, [(0, 3), (5, 10)], [(3, "u3"), (4, "u4")], [], 1, 0, None)
    m2 = Marker("b", "retry", 1, [(3, 4)], [], [], 1, 0, None)
    state = ShardState([m1, m2])
    assert state.claimed == [(0, 10)]
    assert state.pending_retry() == [(4, "u4")]
    assert ShardState.from_json(state.to_json()).markers == state.markers
    assert state.overlaps() == []
    assert ShardState([m1, Marker("c", "range", 1, [(9, 12)], [], [], 2, 1, None)]).overlaps() == [(9, 10)]


def test_incomplete_window_is_an_error(paths):
    s = sink(paths, [[(0, 3)]])
    s.add_rows([0], ["u0"], [0], emb(0), objs(0))
    with pytest.raises(WorkerError, match="1 chunks never completed"):
        s.close()
    with pytest.raises(WorkerError, match="not in this rank's remaining work"):
        sink(paths, [[(0, 3)]]).add_rows([7], ["u7"], [0], emb(7), objs(7))


def test_shard_result_writes_failures_and_result(paths):
    s = sink(paths, [[(0, 4)]])
    s.add_rows([0, 2], ["u0", "u2"], [0, 0], emb(0, 2), objs(0, 2))
    s.add_failure(3, "u3", 0, "missing", "NoSuchKey", False)
    s.add_failure(1, "u1", 0, "bomb", "too many pixels", False)
    s.close()
    store = ObjectStore()
    result = write_shard_result(store, paths, {"m": load_state(store, paths)}, 4, threshold=0.25, info=INFO)
    assert (result.processed, result.failed, result.ok) == (2, 2, False)
    assert result.failed_by_reason == {FailureReason.BOMB: 1, FailureReason.MISSING: 1}
    lines = [FailureLine.model_validate_json(x) for x in Path(paths.failures).read_text().splitlines()]
    assert [(x.key, x.reason, x.attempt) for x in lines] == [("u1", "bomb", 1), ("u3", "missing", 1)]
    written = ShardResult.model_validate_json(Path(paths.result).read_text())
    assert written == result and written.failed_fraction == 0.5
    assert json.loads(Path(paths.result).read_text())["failed_by_reason"] == {"bomb": 1, "missing": 1}
    assert write_shard_result(store, paths, {"m": load_state(store, paths)}, 4, threshold=0.5, info=INFO).ok is True


def test_transient_failures_never_fail_the_shard(paths):
    # Heavy throttling: 3 of 4 keys outlived every retry. They go to the run's retry pass, so
    # the threshold judges only the data failure.
    s = sink(paths, [[(0, 4)]])
    s.add_rows([0], ["u0"], [0], emb(0), objs(0))
    for pos in (1, 2):
        s.add_failure(pos, f"u{pos}", 0, "s3_error_transient", "SlowDown", False)
    s.add_failure(3, "u3", 0, "corrupt", "truncated", False)
    s.close()
    store = ObjectStore()
    result = write_shard_result(store, paths, {"m": load_state(store, paths)}, 4, threshold=0.25, info=INFO)
    assert (result.failed, result.failed_transient, result.failed_fraction, result.ok) == (3, 2, 0.25, True)
    strict = write_shard_result(store, paths, {"m": load_state(store, paths)}, 4, threshold=0.2, info=INFO)
    assert strict.ok is False  # the one corrupt key is over a 20% threshold


def test_shard_result_refuses_gaps_and_double_coverage(paths):
    store = ObjectStore()
    with pytest.raises(WorkerError, match="3 of 3 keys were never settled"):
        write_shard_result(store, paths, {"m": ShardState([])}, 3, threshold=1.0, info=INFO)
    dup = ShardState(
        [Marker("a", "range", 2, [(0, 2)], [], [], 1, 0, None), Marker("b", "range", 2, [(1, 3)], [], [], 2, 0, None)]
    )
    with pytest.raises(WorkerError, match="1 keys are covered by two chunks"):
        write_shard_result(store, paths, {"m": dup}, 3, threshold=1.0, info=INFO)
    assert write_shard_result(store, paths, {"m": ShardState([])}, 0, threshold=0.0, info=INFO).ok is True


def test_orphan_parquet_files_are_removed(paths):
    s = sink(paths, [[(0, 1)]])
    s.add_rows([0], ["u0"], [0], emb(0), objs(0))
    s.close()
    store = ObjectStore()
    orphan = paths.parquet("part-0001-000000007")
    store.put(orphan, b"half written attempt")
    state = load_state(store, paths)
    assert remove_orphans(store, paths, state) == [orphan]
    assert list(store.list(paths.output_dir)) == [
        paths.marker("part-0005-000000000"),
        paths.parquet("part-0005-000000000"),
    ]


def test_rows_carry_what_an_index_upserts(paths):
    s = sink(paths, [[(0, 2)]])
    objs = [("9b2cf535f27731c974343645a3985328", None, 1234), ("d41d8cd98f00b204e9800998ecf8427e-2", "3HL4kqtJ", 9)]
    s.add_rows([1, 0], ["s3://i/b.jpg", "s3://i/a.jpg"], [0, 0], emb(1, 0), objs)
    s.close()
    table = pq.read_table(paths.parquet("part-0005-000000000"))
    assert table.column_names == list(outputs.COLUMNS)
    rows = table.to_pylist()
    assert [r["key"] for r in rows] == ["s3://i/a.jpg", "s3://i/b.jpg"]  # sorted by position
    assert rows[0]["etag"] == "d41d8cd98f00b204e9800998ecf8427e-2" and rows[0]["version_id"] == "3HL4kqtJ"
    assert rows[0]["size"] == 9 and rows[1]["size"] == 1234 and rows[1]["version_id"] is None
    assert {(r["model"], r["model_version"], r["model_id"], r["run"]) for r in rows} == {("m", "v1", "sha256:abc", "r")}


def test_an_object_read_without_etag_or_version_writes_nulls(paths):
    """An unversioned bucket gives no version id, and an S3-compatible store may give no ETag: both null."""
    s = sink(paths, [[(0, 1)]])
    s.add_rows([0], ["u0"], [0], emb(0), [("", None, 7)])
    s.close()
    (row,) = pq.read_table(paths.parquet("part-0005-000000000")).to_pylist()
    assert row["etag"] is None and row["version_id"] is None and row["size"] == 7


def test_owns_what_is_still_owed(paths):
    s = sink(paths, [[(0, 3)], [(5, 6)]], retry=[9])
    assert [p for p in range(10) if s.owns(p, 0)] == [0, 1, 2, 5]
    assert [p for p in range(10) if s.owns(p, 1)] == [9]
    s.add_failure(1, "u1", 0, "s3_error_transient", "503", deferred=True)  # deferred now: owed a final result
    assert s.owns(1, 1)


def test_a_key_is_failed_when_any_model_failed_it(tmp_path):
    store = ObjectStore()
    a = Paths.for_shard(f"{tmp_path}/out/model=a/", f"{tmp_path}/failures/", f"{tmp_path}/shards/", 3)
    b = Paths.for_shard(f"{tmp_path}/out/model=b/", f"{tmp_path}/failures/", f"{tmp_path}/shards/", 3)
    sa, sb = sink(a, [[(0, 3)]]), sink(b, [[(0, 3)]])
    sa.add_rows([0, 1], ["u0", "u1"], [0, 0], emb(0, 1), objs(0, 1))
    sa.add_failure(2, "u2", 0, "corrupt", "bad", deferred=False)
    sb.add_rows([0], ["u0"], [0], emb(0), objs(0))
    sb.add_failure(1, "u1", 0, "corrupt", "bad", deferred=False)
    sb.add_failure(2, "u2", 0, "corrupt", "bad", deferred=False)
    sa.close()
    sb.close()
    states = {"a": load_state(store, a), "b": load_state(store, b)}
    result = write_shard_result(store, a, states, 3, threshold=1.0, info=INFO)
    assert result.processed_by_model == {"a": 2, "b": 1} and result.processed == 1
    assert result.failed == 2 and result.chunks == 2
    assert [json.loads(x)["key"] for x in Path(a.failures).read_text().splitlines()] == ["u1", "u2"]
    with pytest.raises(WorkerError, match="never settled for model b"):
        write_shard_result(store, a, {"a": states["a"], "b": ShardState([])}, 3, threshold=1.0, info=INFO)


def test_a_final_pass_result_is_taken_once(paths):
    """Two fetches of one deferred key (each model's own) give the sink one result, not two."""
    s = sink(paths, [[(0, 1)]], retry=[5])
    assert s.owns(5, 1)
    s.add_rows([5], ["u5"], [1], emb(5), objs(5))
    assert not s.owns(5, 1)
    s.add_rows([0], ["u0"], [0], emb(0), objs(0))
    s.close()
    state = load_state(ObjectStore(), paths)
    assert sorted(state.covered) == [(0, 1), (5, 6)] and not state.overlaps()


def test_an_audio_sinks_markers_carry_the_seconds_their_files_hold_and_result_json_sums_them(paths):
    s = sink(paths, [[(0, 2)], [(2, 4)]], timed=True)
    # file 0: three windows ending at 10, 20, 23.5 s; file 1: one of 4.25 s; file 3: two (its second ends at 12)
    s.add_rows([0] * 3, ["u0"] * 3, [0] * 3, emb(0, 0, 0), objs(0, 0, 0), [(0, 0, 10), (1, 10, 20), (2, 20, 23.5)])
    s.add_rows([1], ["u1"], [0], emb(1), objs(1), [(0, 0.0, 4.25)])
    s.add_failure(2, "u2", 0, "silent", "no sound", False)
    s.add_rows([3, 3], ["u3", "u3"], [0, 0], emb(3, 3), objs(3, 3), [(1, 10, 12), (0, 0, 10)])
    s.close()
    store = ObjectStore()
    state = load_state(store, paths)
    marked = sorted((m.rows, m.extra["parts"], m.extra["media_s"]) for m in state.markers)
    assert marked == [(1, 2, 12.0), (2, 4, 27.75)]
    result = write_shard_result(store, paths, {"m": state}, 4, threshold=0.5, info=INFO)
    assert (result.processed, result.parts, result.media_s) == (3, 6, 39.75)


def test_an_image_sinks_markers_carry_no_seconds_and_its_parts_are_its_rows(paths):
    s = sink(paths, [[(0, 2)]])
    s.add_rows([0, 1], ["u0", "u1"], [0, 0], emb(0, 1), objs(0, 1))
    s.close()
    store = ObjectStore()
    state = load_state(store, paths)
    assert ["media_s" in m.extra for m in state.markers] == [False]
    result = write_shard_result(store, paths, {"m": state}, 2, threshold=0.5, info=INFO)
    assert (result.parts, result.media_s) == (2, 0.0)
