"""An incremental run and the keys whose bytes failed before: the worker records the version that
failed, and the skip rule leaves an unchanged one out (reported as failed_before), so it is not
counted against the new run's max_failed_fraction a second time."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gpu_worker.output.commits import Paths, load_state
from gpu_worker.output.parquet import RecordLabel
from gpu_worker.output.result import write_shard_result
from gpu_worker.output.sink import ChunkSink, SinkSpec
from sluice.aws.store import ObjectStore
from sluice.contracts.results import FailureLine
from sluice.prepare.reducer.skip import FAILED, Skipper, parse, record

B = "imgs"


def test_an_unchanged_key_that_failed_for_its_bytes_is_skipped_and_counted_apart() -> None:
    s = Skipper(2)
    for key, etag in (("bad.jpg", "e1"), ("fixed.jpg", "e2"), ("ok.jpg", "e3")):
        s.add_current(B, key, etag, None)
    s.add_earlier(B, "bad.jpg", 0, FAILED, "e1", None)  # failed with the bytes it has now
    s.add_earlier(B, "fixed.jpg", 0, FAILED, "e0", None)  # failed, then replaced
    for m in (0, 1):
        s.add_earlier(B, "ok.jpg", 0, m, "e3", None)
    assert s.keep(B, ["bad.jpg", "fixed.jpg", "ok.jpg"]) == ["fixed.jpg"]
    assert s.known_bad == 1


def test_the_newest_record_decides_between_a_failure_and_a_row() -> None:
    s = Skipper(1)
    s.add_current(B, "a.jpg", "e1", None)
    s.add_current(B, "b.jpg", "e1", None)
    s.add_earlier(B, "a.jpg", 1, FAILED, "e1", None)  # failed in an older run ...
    s.add_earlier(B, "a.jpg", 0, 0, "e1", None)  # ... embedded since (a decoder that reads it now)
    s.add_earlier(B, "b.jpg", 1, 0, "e0", None)  # an older version embedded ...
    s.add_earlier(B, "b.jpg", 0, FAILED, "e1", None)  # ... the current bytes failed in the newest run
    assert s.keep(B, ["a.jpg", "b.jpg"]) == [] and s.known_bad == 1


def test_a_failure_record_round_trips_through_the_part_format() -> None:
    rec = record("dir/x.jpg", 3, FAILED, "etag", "v1")
    assert parse(rec) == ("dir/x.jpg", 3, FAILED, "etag", "v1")


def test_the_sink_records_the_version_whose_bytes_failed(tmp_path) -> None:
    paths = Paths.for_shard(f"{tmp_path}/out/", f"{tmp_path}/failures/", f"{tmp_path}/shards/", 0)
    spec = SinkSpec(
        rank=0,
        attempt=1,
        windows=[[(0, 3)]],
        chunk_keys=10,
        dtype="float16",
        metadata={},
        label=RecordLabel("m", "v1", "sha256:abc", "r"),
    )
    sink = ChunkSink(ObjectStore(), paths, spec)
    sink.add_rows([0], ["s3://b/0.jpg"], [0], np.eye(1, 4, dtype=np.float32), [("e0", None, 10)])
    sink.read_as(1, ("e1", "v7"))
    sink.add_failure(1, "s3://b/1.jpg", 0, "corrupt", "truncated", False)
    sink.add_failure(2, "s3://b/2.jpg", 0, "missing", "NoSuchKey", False)  # no bytes were read
    sink.close()
    info = {
        "run_id": "r",
        "shard": 0,
        "node": 0,
        "attempt": 1,
        "kind": "array",
        "device": "cpu",
        "world": 1,
        "seconds": 1.0,
        "pipeline_seconds": 1.0,
        "pipeline_window": [],
        "resumed_chunks": 0,
        "stats": {},
    }
    write_shard_result(ObjectStore(), paths, {"m": load_state(ObjectStore(), paths)}, 3, threshold=1.0, info=info)
    text = Path(paths.failures).read_text(encoding="utf-8")
    lines = [FailureLine.model_validate_json(x) for x in text.splitlines()]
    assert [(f.key, f.reason.value, f.etag, f.version_id) for f in lines] == [
        ("s3://b/1.jpg", "corrupt", "e1", "v7"),
        ("s3://b/2.jpg", "missing", None, None),
    ]
