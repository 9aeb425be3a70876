"""The index with keys of several parts (text chunks, video frames): keyed by (key, part), a key replaced whole."""

from __future__ import annotations

from pathlib import Path

import lance
import numpy as np

from gpu_worker.output.parquet import RecordLabel, output_table, table_bytes
from sluice.index.build import build
from sluice.index.search import Searcher

DIM = 16
LABEL = RecordLabel("reference-text", "", "builtin:reference-text@1", "")


def _file(path: Path, rows: list[tuple[str, int]], seed: int, *, whole: bool = False) -> str:
    """A Parquet file in the output schema: (key, part) rows (`whole`: images, written without parts)."""
    emb = np.random.default_rng(seed).standard_normal((len(rows), DIM)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    parts = [(p, 100.0 * p, 100.0 * p + 120.0) for _, p in rows]
    objs = [("etag", None, 1000)] * len(rows)
    table = output_table([k for k, _ in rows], emb, "float32", objs, LABEL, None if whole else parts)
    path.write_bytes(table_bytes(table, {}))
    return str(path)


def _rows(index: Path) -> list[tuple[str, int]]:
    table = lance.dataset(str(index / "reference-text.lance")).to_table(columns=["key", "part"])
    return sorted(zip(table["key"].to_pylist(), table["part"].to_pylist()))


def test_parts_are_rows_of_their_own_and_a_newer_key_replaces_all_its_parts(tmp_path):
    idx = tmp_path / "idx"
    long, short = "s3://docs/report.txt", "s3://docs/note.txt"
    first = _file(tmp_path / "a.parquet", [(long, 0), (long, 1), (long, 2), (short, 0)], 1)
    build([first], str(idx))
    assert _rows(idx) == [(short, 0), (long, 0), (long, 1), (long, 2)]

    # The report was edited down to one chunk: its parts 1 and 2 must not outlive it.
    second = _file(tmp_path / "b.parquet", [(long, 0)], 2)
    build([second], str(idx))
    assert _rows(idx) == [(short, 0), (long, 0)]

    searcher = Searcher.open(str(idx))
    query = searcher.vector_of(long)
    [hits] = searcher.search(query, 2)
    assert (hits[0].key, hits[0].part, hits[0].part_start, hits[0].part_end) == (long, 0, 0.0, 120.0)
    assert searcher.vector_of(long, part=1) is None


def test_a_table_of_images_takes_no_stale_part_pass_and_reads_as_part_zero(tmp_path):
    idx = tmp_path / "idx"
    build([_file(tmp_path / "a.parquet", [("s3://i/a.jpg", 0), ("s3://i/b.jpg", 0)], 3, whole=True)], str(idx))
    build([_file(tmp_path / "b.parquet", [("s3://i/a.jpg", 0)], 4, whole=True)], str(idx))
    assert _rows(idx) == [("s3://i/a.jpg", 0), ("s3://i/b.jpg", 0)]
    [hits] = Searcher.open(str(idx)).search(np.ones(DIM, np.float32), 1)
    assert (hits[0].part, hits[0].part_start, hits[0].part_end) == (0, 0.0, 0.0)
