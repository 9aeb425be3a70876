"""The prepare stage end to end on moto S3: map, reduce, collect for key lists, inventories and prefixes.

Each run checks that the shards decode to exactly the input's unique keys (duplicates seen by
different map workers removed), that shard indices are 0..n-1 with no gap, and that collect()
counts what the shards hold.
"""

from __future__ import annotations

import csv
import errno
import gzip
import io
import json
import os
import random
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote_plus

import boto3
import pytest
from moto import mock_aws

from sluice.aws.errors import AwsFatalError
from sluice.aws.store import ObjectStore
from sluice.contracts.prepare import InventoryFiles, PrefixRange, PrepareSpec, PrepareTask, ReduceResult
from sluice.paths import RunPaths
from sluice.prepare import prepare_store
from sluice.prepare.__main__ import main
from sluice.prepare.collect import Collected, collect
from sluice.prepare.mapper import parts as mapparts
from sluice.prepare.mapper.parts import SpillError
from sluice.prepare.mapper.worker import run_map
from sluice.prepare.reducer.parts import PrepareError
from sluice.prepare.reducer.worker import run_reduce
from sluice.prepare.split import (
    estimate_inventory,
    estimate_keylist,
    inventory_tasks,
    keylist_tasks,
    prefix_tasks,
)
from sluice.shards import ShardReader

CTL, INPUT = "ctl", "inputs"
BUCKETS = ["img-a", "img-b", "img-c"]
Pair = tuple[str, str]


@pytest.fixture
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        for b in (CTL, INPUT, *BUCKETS):
            client.create_bucket(Bucket=b)
        yield client


def make_pairs(n: int, seed: int = 1, dup_every: int = 10) -> list[Pair]:
    """n entries in input order: realistic keys over several buckets, ~1/dup_every repeating an earlier one."""
    rnd = random.Random(seed)
    out: list[Pair] = []
    for i in range(n):
        if out and i % dup_every == 0:
            out.append(out[rnd.randrange(len(out))])
        elif i % 2:
            out.append(
                (
                    rnd.choice(BUCKETS),
                    f"assets/2024-0{rnd.randint(1, 9)}-1{rnd.randint(0, 9)}/{rnd.getrandbits(64):016x}.jpg",
                )
            )
        else:
            out.append(
                (rnd.choice(BUCKETS), f"stock/{rnd.randint(0, 99999)}/{rnd.choice(['orig', 'thumb, small'])}.jpg")
            )
    return out


def keylist_body(pairs: list[Pair], fmt: str) -> bytes:
    if fmt == ".txt":
        lines = [f"s3://{b}/{k}" + ("\r" if i % 7 == 0 else "") for i, (b, k) in enumerate(pairs)]
        lines[5:5] = ["", "   "]  # blank lines count as lines but name no key
        return ("\n".join(lines) + "\n").encode()
    if fmt == ".csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["bucket", "key"])
        w.writerows(pairs)
        return buf.getvalue().encode()
    rows = []
    for i, (b, k) in enumerate(pairs):
        rows.append([{"uri": f"s3://{b}/{k}"}, {"bucket": b, "key": k}, f"s3://{b}/{k}"][i % 3])
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def spec_for(
    tasks: list[PrepareTask], workers: int, partitions: int, kps: int, root: str = "runs/r/", **kw: Any
) -> PrepareSpec:
    return PrepareSpec(
        run_id="r",
        manifest_uri=f"s3://{CTL}/manifests/m.json",
        root=f"s3://{CTL}/{root}",
        workers=workers,
        partitions=partitions,
        keys_per_shard=kps,
        max_keys=kw.pop("max_keys", 10**8),
        tasks=tasks,
        **kw,
    )


def keylist_spec(
    s3: Any,
    pairs: list[Pair],
    fmt: str,
    workers: int,
    partitions: int,
    kps: int = 200,
    body: bytes | None = None,
    **kw: Any,
) -> PrepareSpec:
    key = f"lists/keys{fmt}"
    s3.put_object(Bucket=INPUT, Key=key, Body=body if body is not None else keylist_body(pairs, fmt))
    uri = f"s3://{INPUT}/{key}"
    est = estimate_keylist(prepare_store(s3), uri)
    return spec_for(list(keylist_tasks(uri, est.size, est.format, est.header, workers)), workers, partitions, kps, **kw)


def run_all(spec: PrepareSpec, store: ObjectStore) -> Collected:
    for w in range(spec.workers):
        run_map(spec, w, store)
    for r in range(spec.partitions):
        run_reduce(spec, r, store)
    return collect(spec, store)


def shard_indices(s3: Any, spec: PrepareSpec) -> list[int]:
    prefix = RunPaths(spec.root).shards_prefix.removeprefix(f"s3://{CTL}/")
    keys = [
        o["Key"]
        for p in s3.get_paginator("list_objects_v2").paginate(Bucket=CTL, Prefix=prefix)
        for o in p.get("Contents", [])
    ]
    return sorted(int(k.rsplit("/", 1)[1].split(".")[0]) for k in keys)


def decoded(store: ObjectStore, spec: PrepareSpec, n: int) -> list[list[Pair]]:
    return [ShardReader(store.get(RunPaths(spec.root).shard(i))).pairs() for i in range(n)]


def check(s3: Any, spec: PrepareSpec, got: Collected, expected: list[Pair]) -> list[list[Pair]]:
    """The invariants every successful prepare run keeps."""
    store = prepare_store(s3)
    assert got.rejected is None, got.rejected
    assert shard_indices(s3, spec) == list(range(got.n_shards))
    shards = decoded(store, spec, got.n_shards)
    flat = [p for s in shards for p in s]
    assert len(flat) == len(set(flat)) == got.unique_keys  # every unique key exactly once
    assert set(flat) == set(expected)
    assert (got.keys_in, got.duplicates) == (len(expected), len(expected) - len(set(expected)))
    assert got.buckets == sorted({b for b, _ in expected})  # the plan's input_buckets (the Region check)
    assert [len(s) for s in shards] == got.shard_keys
    for r in range(spec.partitions):
        res = ReduceResult.model_validate_json(store.get(RunPaths(spec.root).reduce_result(r)))
        if res.shard_keys:
            assert max(res.shard_keys) - min(res.shard_keys) <= 1
            assert spec.mode == "multinode" or max(res.shard_keys) <= spec.keys_per_shard
    for s in shards:  # sorted inside, as the shard format's flag says
        assert s == sorted(s)
    return shards


@pytest.mark.parametrize(
    ("fmt", "workers", "partitions"),
    [(".txt", 1, 1), (".txt", 3, 4), (".csv", 2, 3), (".csv", 5, 2), (".jsonl", 3, 1), (".jsonl", 5, 5)],
)
def test_keylist(s3, fmt, workers, partitions):
    pairs = make_pairs(2500, seed=workers * 10 + partitions)
    spec = keylist_spec(s3, pairs, fmt, workers, partitions)
    got = run_all(spec, prepare_store(s3))
    check(s3, spec, got, pairs)
    tags = s3.get_object_tagging(Bucket=CTL, Key="runs/r/shards/0.shard")["TagSet"]
    assert tags == [{"Key": "sluice-scratch", "Value": "true"}]


def test_same_partitions_give_the_same_shards_whatever_the_workers(s3):
    pairs = make_pairs(1500, seed=4)
    store = prepare_store(s3)
    seen = []
    for workers in (1, 2, 5):
        spec = keylist_spec(s3, pairs, ".txt", workers, 3, root=f"runs/p{workers}/")
        got = run_all(spec, store)
        seen.append([store.get(RunPaths(spec.root).shard(i)) for i in range(got.n_shards)])
    assert seen[0] == seen[1] == seen[2]


def test_retried_workers_write_identical_bytes(s3):
    pairs = make_pairs(2000, seed=5)
    spec = keylist_spec(s3, pairs, ".txt", 3, 3)
    store, paths = prepare_store(s3), RunPaths(spec.root)
    got = run_all(spec, store)
    parts = {(w, r): store.get(paths.prepare_part(w, r)) for w in range(3) for r in range(3)}
    shards = [store.get(paths.shard(i)) for i in range(got.n_shards)]
    # worker 1 "died" after writing a damaged part and before its MapResult; Batch retries it
    store.put(paths.prepare_part(1, 0), b"garbage")
    s3.delete_object(Bucket=CTL, Key=paths.map_result(1).removeprefix(f"s3://{CTL}/"))
    with pytest.raises(PrepareError, match="map worker 1 left no result"):
        run_reduce(spec, 0, store)
    run_map(spec, 1, store)
    run_map(spec, 2, store)  # a duplicate attempt of a worker that had finished
    assert {(w, r): store.get(paths.prepare_part(w, r)) for w in range(3) for r in range(3)} == parts
    store.put(paths.shard(0), b"half a shard")
    for r in (0, 0, 1, 2):
        run_reduce(spec, r, store)
    assert [store.get(paths.shard(i)) for i in range(got.n_shards)] == shards
    assert collect(spec, store).shard_keys == got.shard_keys


def test_multinode_has_one_shard_per_node(s3):
    pairs = make_pairs(900, seed=6)
    spec = keylist_spec(s3, pairs, ".txt", 2, 3, mode="multinode", nodes=3)
    got = run_all(spec, prepare_store(s3))
    assert got.n_shards == 3
    check(s3, spec, got, pairs)


def test_inventory_csv_gzip(s3):
    pairs = [*make_pairs(1800, seed=7), ("img-a", "with space+plus/ü.jpg")]
    files, expected = [], []
    for f in range(4):
        chunk = pairs[f::4]
        rows = [[b, quote_plus(k), "123"] for b, k in chunk]
        if f == 1:
            rows.append(["img-a", quote_plus("folder/"), "0"])  # a folder marker: skipped
        buf = io.StringIO()
        csv.writer(buf, quoting=csv.QUOTE_ALL).writerows(rows)
        key = f"inv/data/{f}.csv.gz"
        s3.put_object(Bucket=INPUT, Key=key, Body=gzip.compress(buf.getvalue().encode()))
        files.append({"key": key, "size": 100 * (f + 1)})
        expected += chunk
    manifest = {
        "sourceBucket": "img-a",
        "destinationBucket": f"arn:aws:s3:::{INPUT}",
        "fileFormat": "CSV",
        "fileSchema": "Bucket, Key, Size",
        "files": files,
    }
    s3.put_object(Bucket=INPUT, Key="inv/manifest.json", Body=json.dumps(manifest).encode())
    est = estimate_inventory(prepare_store(s3), f"s3://{INPUT}/inv/manifest.json")
    assert est.total_bytes == 1000
    for workers, partitions in ((1, 2), (3, 3)):
        spec = spec_for(list(inventory_tasks(est.report, workers)), workers, partitions, 300, root=f"runs/i{workers}/")
        check(s3, spec, run_all(spec, prepare_store(s3)), expected)


def test_inventory_parquet(s3):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pairs = make_pairs(1200, seed=8)
    files = []
    for f in range(3):
        chunk = pairs[f::3]
        buf = io.BytesIO()
        pq.write_table(
            pa.table({"bucket": [b for b, _ in chunk], "key": [k for _, k in chunk], "size": [1] * len(chunk)}), buf
        )
        key = f"invp/data/{f}.parquet"
        s3.put_object(Bucket=INPUT, Key=key, Body=buf.getvalue())
        files.append({"key": key})
    manifest = {
        "destinationBucket": f"arn:aws:s3:::{INPUT}",
        "fileFormat": "Parquet",
        "fileSchema": "message s3.inventory { }",
        "files": files,
    }
    s3.put_object(Bucket=INPUT, Key="invp/manifest.json", Body=json.dumps(manifest).encode())
    est = estimate_inventory(prepare_store(s3), f"s3://{INPUT}/invp/manifest.json")
    spec = spec_for(list(inventory_tasks(est.report, 2)), 2, 2, 250)
    check(s3, spec, run_all(spec, prepare_store(s3)), pairs)


def test_prefix(s3):
    keys = [f"cams/{c}/{d:02d}/{i}.jpg" for c in "abc" for d in range(6) for i in range(8)]
    keys += ["cams/top.jpg", "cams/a/", "cams/readme.txt", "elsewhere/x.jpg"]
    for k in keys:
        s3.put_object(Bucket="img-a", Key=k, Body=b"")
    expected = [("img-a", k) for k in keys if k.startswith("cams/") and k.endswith(".jpg")]
    for workers, partitions in ((1, 1), (2, 3), (5, 2)):
        tasks = prefix_tasks(s3, "img-a", "cams/", workers)
        spec = spec_for(list(tasks), workers, partitions, 50, root=f"runs/x{workers}/", suffixes=[".JPG"])
        check(s3, spec, run_all(spec, prepare_store(s3)), expected)


# ---- bad input: recorded by the map worker, the run rejected with global line numbers ----


def test_bad_lines_reject_with_global_line_numbers(s3):
    pairs = make_pairs(3000, seed=9)
    lines = [f"s3://{b}/{k}" for b, k in pairs]
    lines[1699] = "http://example.com/a.jpg"  # line 1700, in the second of three ranges
    lines[2998] = "s3://Bad_Bucket/k.jpg"  # line 2999, in the third
    spec = keylist_spec(s3, pairs, ".txt", 3, 2, body=("\n".join(lines) + "\n").encode())
    got = run_all(spec, prepare_store(s3))
    assert got.rejected == [
        "keys.txt line 1700: not a key: 'http://example.com/a.jpg' is a URL; use s3://bucket/key or a bare key",
        "keys.txt line 2999: not a key: 's3://Bad_Bucket/k.jpg': 'Bad_Bucket' is not a valid bucket name",
    ]
    assert shard_indices(s3, spec) == []  # reducers skipped: no shard written
    res = ReduceResult.model_validate_json(prepare_store(s3).get(RunPaths(spec.root).reduce_result(1)))
    assert res.skipped


def test_csv_header_and_many_problems(s3):
    rows = ["bucket,key"] + [f"img-a,k/{i}.jpg" for i in range(2000)]
    for n in range(300, 2000, 60):  # 29 bad rows spread over every range
        rows[n - 1] = f"img-a,dir{n}/"  # line n (the header is line 1)
    spec = keylist_spec(s3, [], ".csv", 4, 2, body=("\n".join(rows) + "\n").encode())
    got = run_all(spec, prepare_store(s3))
    assert got.rejected is not None and len(got.rejected) == 21
    assert (
        got.rejected[0]
        == "keys.csv line 300: not a key: 'dir300/' ends with '/' (a prefix); use input.prefix to list it"
    )
    assert got.rejected[19].startswith("keys.csv line 1440: ")
    assert got.rejected[20] == "... and 9 more problems"


def test_not_utf8_allowed_buckets_and_missing_bucket(s3):
    good = [f"s3://img-a/k/{i}.jpg" for i in range(1000)]
    body = (
        ("\n".join(good[:800]) + "\n").encode() + b"s3://img-a/bad\xff.jpg\n" + ("\n".join(good[800:]) + "\n").encode()
    )
    spec = keylist_spec(s3, [], ".txt", 2, 1, body=body)
    got = run_all(spec, prepare_store(s3))
    assert got.rejected is not None and got.rejected[0].startswith(
        "keys.txt line 801: not UTF-8 (invalid byte at offset "
    )
    offset = int(got.rejected[0].split("offset ")[1].split(")")[0])
    assert body[offset] == 0xFF
    spec = keylist_spec(
        s3, [], ".txt", 2, 1, body=b"s3://img-a/x.jpg\n" * 5 + b"s3://img-b/y.jpg\n", allowed_buckets=["img-a"]
    )
    got = run_all(spec, prepare_store(s3))
    assert got.rejected == [
        "keys.txt line 6: s3://img-b/y.jpg: bucket 'img-b' is not allowed (SLUICE_ALLOWED_BUCKETS: img-a)"
    ]
    spec = spec_for([PrefixRange(bucket="no-such-bucket", prefix="")], 1, 1, 10)
    assert run_all(spec, prepare_store(s3)).rejected == ["prefix s3://no-such-bucket/: the bucket does not exist"]


def test_zero_keys_and_too_many(s3):
    pairs = make_pairs(300, seed=10)
    spec = keylist_spec(s3, pairs, ".txt", 2, 2, suffixes=[".png"])
    assert run_all(spec, prepare_store(s3)).rejected == ["the input names zero keys: nothing to run"]
    spec = keylist_spec(s3, pairs, ".txt", 2, 2, max_keys=100)
    got = run_all(spec, prepare_store(s3))
    limit = "more than the 100 a run may hold (SLUICE_MAX_KEYS): split the input into several manifests"
    assert got.rejected == [f"{got.unique_keys} unique keys, {limit}"]


def test_entry_point_exit_codes(s3, monkeypatch, capsys):
    pairs = make_pairs(400, seed=11)
    spec = keylist_spec(s3, pairs, ".txt", 2, 2)
    store = prepare_store(s3)
    spec_uri = RunPaths(spec.root).prepare_spec
    store.put(spec_uri, spec.model_dump_json().encode())
    monkeypatch.setenv("AWS_BATCH_JOB_ARRAY_INDEX", "1")
    assert main(["map", "--spec", spec_uri], store=store) == 0
    assert main(["reduce", "--spec", spec_uri], store=store) == 1  # map worker 0 has not run
    assert "map worker 0 left no result" in capsys.readouterr().err
    monkeypatch.delenv("AWS_BATCH_JOB_ARRAY_INDEX")
    assert main(["map", "--spec", spec_uri], store=store) == 0
    assert main(["reduce", "--spec", spec_uri], store=store) == 0
    monkeypatch.setenv("AWS_BATCH_JOB_ARRAY_INDEX", "7")
    assert main(["map", "--spec", spec_uri], store=store) == 1
    assert "outside 0..1" in capsys.readouterr().err
    assert main(["map", "--spec", f"s3://{CTL}/nope.json"], store=store) == 1
    assert "NoSuchKey" in capsys.readouterr().err


# ---- a local spill failure is the worker's, not the input's: the job fails, Batch retries it ----


class FullDisk:
    """Part files on a disk that fills up once: the first write past `room` bytes fails as the OS fails
    it (ENOSPC); later writes succeed, as when another process frees space right after."""

    def __init__(self, room: int) -> None:
        self.room, self.failed = room, 0

    def open(self, path: str, mode: str) -> Any:
        disk, fh = self, open(path, mode)  # noqa: SIM115 - the code under test closes it

        class File:
            def write(self, data: bytes) -> int:
                if not disk.failed and len(data) > disk.room:
                    disk.failed += 1
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                disk.room -= len(data)
                return int(fh.write(data))

            def __getattr__(self, name: str) -> Any:
                return getattr(fh, name)

        return File()


def inventory_spec(s3: Any, pairs: list[Pair]) -> PrepareSpec:
    """One gzip CSV inventory data file holding `pairs`, as one map task."""
    buf = io.StringIO()
    csv.writer(buf).writerows([b, quote_plus(k), "1"] for b, k in pairs)
    s3.put_object(Bucket=INPUT, Key="full/0.csv.gz", Body=gzip.compress(buf.getvalue().encode()))
    task = InventoryFiles(bucket=INPUT, keys=["full/0.csv.gz"], format="CSV", columns=["Bucket", "Key", "Size"])
    return spec_for([task], 1, 2, 500, root="runs/full/")


def test_a_full_spill_disk_fails_the_map_worker_and_never_rejects_the_input(s3, monkeypatch, capsys):
    pairs = make_pairs(1500, seed=12, dup_every=10**9)
    spec = inventory_spec(s3, pairs)
    store, paths = prepare_store(s3), RunPaths(spec.root)
    # Part files are written while the inventory is read once FLUSH_BUDGET keys wait in memory (a
    # budget of 512 here instead of 262,144); their disk has room for the shard headers only, once.
    monkeypatch.setattr(mapparts, "FLUSH_BUDGET", 512)
    disk = FullDisk(room=64)
    monkeypatch.setattr(mapparts, "open", disk.open, raising=False)
    with pytest.raises(SpillError, match=r"cannot write the spill file .*/[01]\.part: No space left on device"):
        run_map(spec, 0, store)
    assert disk.failed == 1
    with pytest.raises(AwsFatalError, match="NoSuchKey"):  # no MapResult: nothing records a rejection
        store.get(paths.map_result(0))
    spec_uri = paths.prepare_spec
    store.put(spec_uri, spec.model_dump_json().encode())
    monkeypatch.setattr(mapparts, "open", FullDisk(room=64).open, raising=False)
    assert main(["map", "--spec", spec_uri], store=store) == 1  # Batch retries the job
    err = capsys.readouterr().err
    assert "sluice-prepare map: error: cannot write the spill file" in err and "(errno 28)" in err
    monkeypatch.undo()  # the retry, on a disk with room
    res = run_map(spec, 0, store)
    assert (res.problem_count, res.keys_in) == (0, len(pairs))


def test_an_unwritable_spill_dir_fails_the_map_worker(s3, tmp_path, monkeypatch, capsys):
    spec = inventory_spec(s3, make_pairs(50, seed=13))
    not_a_dir = tmp_path / "spill"
    not_a_dir.write_text("a file where the spill directory should be")
    with pytest.raises(SpillError, match=f"cannot write the spill file {not_a_dir}: Not a directory"):
        run_map(spec, 0, prepare_store(s3), spill_dir=str(not_a_dir))
    store = prepare_store(s3)
    spec_uri = RunPaths(spec.root).prepare_spec
    store.put(spec_uri, spec.model_dump_json().encode())
    monkeypatch.setenv("SLUICE_SPILL_DIR", str(not_a_dir))
    assert main(["map", "--spec", spec_uri], store=store) == 1
    assert "Not a directory (errno 20)" in capsys.readouterr().err
