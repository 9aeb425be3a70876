"""A text or video rank's parts pass: a key's parts land in one chunk, settle once; failures go as images' do
(the objects on moto's S3)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from gpu_worker.config import WorkerConfig
from gpu_worker.errors import ObjectFailure
from gpu_worker.kinds.base import Part, PartsInfo
from gpu_worker.output import intervals
from gpu_worker.output.commits import Paths, load_state
from gpu_worker.output.parquet import RecordLabel
from gpu_worker.output.sink import ChunkSink, SinkSpec
from gpu_worker.passes.base import KeySinks
from gpu_worker.passes.keys import Item
from gpu_worker.passes.parts import PartsStream
from gpu_worker.telemetry.stats import Stats
from sluice.aws.store import ObjectStore
from sluice.contracts.status import FailureReason
from tests.worker_gets import Gets, moto_objects

OBJECTS = {"one": b"a bb ccc", "flaky": b"dddd eeeee", "bad": b"\x00\x01", "two": b"ffffff", "three": b"g hh"}
WORDS = {f"k{i}": b"w " * 3 for i in range(10)}  # 3 parts a key, 30 in all


@pytest.fixture(autouse=True)
def objects() -> Iterator[Any]:
    """OBJECTS and WORDS in the bucket "bkt" of moto's S3."""
    yield from moto_objects("bkt", {**OBJECTS, **WORDS})


class WordsEmbedder:
    """A part a word (its offsets), embedded as a one-hot of its length: enough to check where rows go."""

    info = PartsInfo("words")
    output_dim = 8
    sort_batches = 1

    def split(self, data: bytes) -> list[Part]:
        if data.startswith(b"\x00"):
            raise ObjectFailure(FailureReason.NOT_TEXT, "binary")
        parts, at = [], 0
        for i, word in enumerate(data.decode().split()):
            start = data.decode().index(word, at)
            at = start + len(word)
            parts.append(Part(i, float(start), float(at), len(word)))
        return parts

    def embed(self, payloads):
        out = np.zeros((len(payloads), self.output_dim), np.float32)
        out[np.arange(len(payloads)), np.minimum(payloads, 7)] = 1.0
        return out


def test_parts_of_a_key_settle_once_and_a_deferred_key_comes_back_in_the_final_pass(tmp_path):
    keys = list(OBJECTS)
    paths = Paths.for_shard(f"{tmp_path}/out/", f"{tmp_path}/failures/", f"{tmp_path}/shards/", 0)
    spec = SinkSpec(
        rank=0,
        attempt=1,
        windows=intervals.cut([(0, len(keys))], 2),  # chunks of 2 keys: parts never split a key's chunk
        chunk_keys=2,
        dtype="float32",
        metadata={"model": "words"},
        label=RecordLabel("words", "", "test@1", "r"),
    )
    cfg = WorkerConfig.model_validate({}).replace(final_backoff_base_s=0.0, fetch_concurrency=3, retries=0)
    outputs = KeySinks([ChunkSink(ObjectStore(), paths, spec)], Stats())
    with Gets(cfg, slow_down=lambda key, n: key == "flaky" and n == 1):  # "flaky" throttled until the final pass
        PartsStream(cfg, [WordsEmbedder()], outputs, batch=3).run([Item(i, "bkt", k, 0) for i, k in enumerate(keys)])
    outputs.finish(ok=True)

    state = load_state(ObjectStore(), paths)
    assert intervals.count(state.covered) == len(keys) and not state.overlaps()
    assert dict(outputs.reasons) == {"not_text": 1} and outputs.stats.get("failed") == 1
    rows = []
    for m in sorted(state.markers, key=lambda m: m.name):
        if m.file:
            rows += pq.read_table(f"{paths.output_dir}/{m.file}").to_pylist()
    got = [(r["key"].rsplit("/", 1)[-1], r["part"], r["part_start"], r["part_end"]) for r in rows]
    assert sorted(got) == sorted(
        [
            ("one", 0, 0, 1),
            ("one", 1, 2, 4),
            ("one", 2, 5, 8),
            ("flaky", 0, 0, 4),
            ("flaky", 1, 5, 10),
            ("two", 0, 0, 6),
            ("three", 0, 0, 1),
            ("three", 1, 2, 4),
        ]
    )
    retry = [m for m in state.markers if m.kind == "retry"]
    assert len(retry) == 1 and retry[0].rows == 1  # the flaky key: one key, two rows, in the final pass
    failed = [f for m in state.markers for f in m.failed]
    assert [(f["key"], f["reason"]) for f in failed] == [("s3://bkt/bad", "not_text")]
    marker_rows = sum(m.rows for m in state.markers)
    assert marker_rows == 4, json.dumps([m.rows for m in state.markers])  # keys embedded, not parts
    assert sum(m.extra["parts"] for m in state.markers) == len(rows) == 8  # parts: the Parquet rows


class Grouped(WordsEmbedder):
    """WordsEmbedder that gathers two batches per embed call (as a text model sorts them), noting each call."""

    sort_batches = 2

    def __init__(self) -> None:
        self.calls: list[int] = []

    def embed(self, payloads):
        self.calls.append(len(payloads))
        return super().embed(payloads)


def test_a_model_that_sorts_gets_its_batches_gathered_into_one_call(tmp_path):
    paths = Paths.for_shard(f"{tmp_path}/out/", f"{tmp_path}/failures/", f"{tmp_path}/shards/", 0)
    spec = SinkSpec(0, 1, intervals.cut([(0, 10)], 10), 10, "float32", {"model": "w"}, RecordLabel("w", "", "t@1", "r"))
    embedder = Grouped()
    cfg = WorkerConfig.model_validate({}).replace(fetch_concurrency=1)
    outputs = KeySinks([ChunkSink(ObjectStore(), paths, spec)], Stats())
    PartsStream(cfg, [embedder], outputs, batch=4).run([Item(i, "bkt", k, 0) for i, k in enumerate(WORDS)])
    outputs.finish(ok=True)
    assert sum(embedder.calls) == 30 and all(n >= 8 for n in embedder.calls[:-1]), embedder.calls
