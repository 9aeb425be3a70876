"""The prepare stage's splitting: every line, data file and key lands in exactly one task; sizing numbers."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.aws.store import ObjectStore
from sluice.errors import Rejection
from sluice.input.inventory import InventoryReport, read_inventory_manifest
from sluice.prepare import prepare_store
from sluice.prepare.mapper.keylist import OwnedLines
from sluice.prepare.mapper.parts import Parts, TaskProblems
from sluice.prepare.mapper.router import KeyRouter
from sluice.prepare.mapper.worker import map_prefix
from sluice.prepare.split import (
    choose_partitions,
    choose_workers,
    estimate_keylist,
    inventory_tasks,
    keylist_tasks,
    prefix_tasks,
)
from tests.properties import examples

EXAMPLES = examples(12)
PROPERTY = settings(max_examples=EXAMPLES, deadline=None)

line_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=12)


@PROPERTY
@given(
    st.lists(line_text, max_size=40),
    st.booleans(),
    st.integers(1, 7),
    st.integers(1, 9),
)
def test_byte_ranges_own_every_line_exactly_once(lines: list[str], final_newline: bool, workers: int, chunk: int):
    data = "\n".join(lines).encode() + (b"\n" if final_newline and lines else b"")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "keys.txt")
        with open(path, "wb") as fh:
            fh.write(data)
        tasks = keylist_tasks(path, len(data), ".txt", None, workers)
        assert [t.start for t in tasks] == [0, *(t.end for t in tasks[:-1])] and tasks[-1].end == len(data)
        owned = [OwnedLines(prepare_store(), t, chunk=chunk) for t in tasks]
        pieces = [b"".join(o.chunks()) for o in owned]
    assert b"".join(pieces) == data  # contiguous, in order, nothing twice
    offset = 0
    for t, piece in zip(tasks, pieces):  # each range's lines start inside it
        if piece:
            assert t.start <= offset < t.end
            assert offset == 0 or data[offset - 1 : offset] == b"\n"
        offset += len(piece)
    assert sum(o.lines for o in owned) == (data.count(b"\n") + (0 if not data or data.endswith(b"\n") else 1))


def test_keylist_estimate_reads_only_the_head(tmp_path):
    path = tmp_path / "big.csv"
    rows = ["bucket,key"] + [f"images,photos/{i:08d}.jpg" for i in range(20_000)]
    path.write_text("\n".join(rows) + "\n")
    est = estimate_keylist(prepare_store(), str(path))
    assert est.header == ["bucket", "key"] and not est.exact and est.format == ".csv"
    assert abs(est.keys_estimate - 20_000) < 200  # equal-length lines: within 1%
    small = tmp_path / "small.txt"
    small.write_text("a\n\nb\nc")
    est = estimate_keylist(prepare_store(), str(small))
    assert est.exact and est.keys_estimate == 3 and est.header is None
    headerless = tmp_path / "h.csv"
    headerless.write_text("images,a.jpg\n")
    assert estimate_keylist(prepare_store(), str(headerless)).header is None


def test_sizing_numbers():
    assert choose_workers(0) == 2 and choose_workers(10_000_000) == 2 and choose_workers(300_000_000) == 60
    assert choose_workers(10**10) == 128
    assert choose_partitions(1) == 1 and choose_partitions(300_000_000) == 75 and choose_partitions(10**12) == 512
    assert choose_partitions(10**9, mode="multinode", nodes=7) == 7


def test_inventory_files_spread_by_size():
    sizes = [50, 10, 10, 40, 30, 5, 5, 60]
    report = InventoryReport(
        "s3://b/m.json", "dest", "CSV", ["Bucket", "Key"], [f"d/{i}.csv.gz" for i in range(8)], sizes
    )  # type: ignore[arg-type]
    tasks = inventory_tasks(report, 3)
    assert sorted(k for t in tasks for k in t.keys) == sorted(report.files)
    loads = [sum(sizes[report.files.index(k)] for k in t.keys) for t in tasks]
    assert max(loads) - min(loads) <= max(sizes)
    for t in tasks:
        idx = [report.files.index(k) for k in t.keys]
        assert idx == sorted(idx) and t.first_file == idx[0]
    assert len(inventory_tasks(report, 20)) == 8  # never more tasks than files


def test_inventory_manifest_rules():
    ok = {
        "fileFormat": "CSV",
        "files": [{"key": "a.csv.gz", "size": 10}, {"key": "b.csv.gz"}],
        "fileSchema": "Bucket, Key, Size",
    }
    rep = read_inventory_manifest(json.dumps(ok).encode(), "s3://inv/m.json")
    assert rep.bucket == "inv" and rep.sizes == [10, None] and rep.columns == ["Bucket", "Key", "Size"]
    with pytest.raises(Rejection, match="inventory format ORC is not supported"):
        read_inventory_manifest(json.dumps({**ok, "fileFormat": "ORC"}).encode(), "s3://inv/m.json")
    with pytest.raises(Rejection, match="lists no data files"):
        read_inventory_manifest(json.dumps({**ok, "files": []}).encode(), "s3://inv/m.json")
    with pytest.raises(Rejection, match=r"not an S3 Inventory manifest\.json"):
        read_inventory_manifest(b"{}", "s3://inv/m.json")


# ---- prefixes: a fake S3 lister with ListObjectsV2's semantics -------------------------


class FakeLister:
    """list_objects_v2 over an in-memory key set: Prefix, Delimiter, StartAfter, ContinuationToken, pages."""

    def __init__(self, keys: set[str], page: int) -> None:
        self.keys = sorted(keys)
        self.page = page
        self.calls = 0

    def list_objects_v2(self, **kw: Any) -> dict[str, Any]:
        self.calls += 1
        prefix, delim = kw.get("Prefix", ""), kw.get("Delimiter")
        after = kw.get("ContinuationToken") or kw.get("StartAfter") or ""
        items: list[tuple[str, bool]] = []  # (key or common prefix, is_prefix)
        for k in self.keys:
            if not k.startswith(prefix) or k <= after:
                continue
            if delim and delim in k[len(prefix) :]:
                cp = k[: k.index(delim, len(prefix)) + 1]
                if cp <= after or (items and items[-1] == (cp, True)):
                    continue
                items.append((cp, True))
            else:
                items.append((k, False))
            if len(items) > self.page:
                break
        more = len(items) > self.page
        items = items[: self.page]
        resp: dict[str, Any] = {
            "Contents": [{"Key": k} for k, p in items if not p],
            "CommonPrefixes": [{"Prefix": k} for k, p in items if p],
            "IsTruncated": more,
        }
        if more:
            resp["NextContinuationToken"] = items[-1][0] if not items[-1][1] else items[-1][0] + "\U0010ffff"
        return resp


def _listed(store: ObjectStore, tasks: list[Any]) -> list[str]:
    out: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        problems = TaskProblems()
        sink = KeyRouter(Parts(tmp, 1), problems, frozenset(), None)
        for t in tasks:
            map_prefix(t, store, problems, lambda b, ks: out.extend(ks))
        sink.parts.close()
        assert problems.count == 0
    return out


segment = st.text("ab0./-", min_size=0, max_size=4)
key_sets = st.sets(st.lists(segment, min_size=1, max_size=4).map("/".join), max_size=60)


@PROPERTY
@given(key_sets, st.sampled_from(["", "a", "a/", "0/b"]), st.integers(1, 6), st.integers(1, 5), st.integers(1, 4))
def test_prefix_ranges_cover_every_key_exactly_once(
    keys: set[str], prefix: str, workers: int, page: int, max_pages: int
):
    keys = {k for k in keys if k}
    fake = FakeLister(keys, page)
    tasks = prefix_tasks(fake, "b", prefix, workers, max_pages=max_pages)
    bounds = [t.stop_at for t in tasks[:-1]]
    assert tasks[0].start_after is None and tasks[-1].stop_at is None
    assert all(t.start_after == s for t, s in zip(tasks[1:], bounds)) and bounds == sorted(set(bounds))
    assert all(b is not None and b.endswith("/") for b in bounds)  # only a folder marker can equal one
    expected = sorted(k for k in keys if k.startswith(prefix) and not k.endswith("/"))
    assert sorted(_listed(prepare_store(fake), tasks)) == expected


def test_prefix_fan_out_shapes():
    many = {f"p/{d:04d}/{i}.jpg" for d in range(300) for i in range(3)}
    tasks = prefix_tasks(FakeLister(many, 1000), "b", "p/", 8)
    assert 25 <= len(tasks) <= 40  # ~4 a worker, cut at common prefixes
    flat = {f"p/{i:032x}.jpg" for i in range(0, 2**128, 2**128 // 2000)}
    tasks = prefix_tasks(FakeLister(flat, 1000), "b", "p/", 8)
    assert len(tasks) >= 16  # no common prefixes: cut on the next characters
    listed = _listed(prepare_store(FakeLister(flat, 1000)), tasks)
    assert sorted(listed) == sorted(flat)
    biggest = max(len([k for k in flat if (t.start_after or "") < k < (t.stop_at or "\uffff")]) for t in tasks)
    assert biggest < len(flat) / 4  # reasonably even
