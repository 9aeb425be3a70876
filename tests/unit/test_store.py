"""The object store: S3 and local directories alike; transient S3 errors retried (a store made with retries),
others fatal; ranged reads of a local file."""

from __future__ import annotations

import io
import os
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sluice.aws.errors import AwsFatalError, AwsRetriableError, Kind
from sluice.aws.ranged import RangedObject, RangeFile
from sluice.aws.store import ObjectStore
from sluice.errors import RetriableError, ShardFormatError
from sluice.prepare import RETRIES, prepare_store


def _error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


class Flaky:
    """An S3 client whose put_object fails with `code` the first `failures` times."""

    def __init__(self, code: str, status: int, failures: int) -> None:
        self.code, self.status, self.failures, self.calls = code, status, failures, 0

    def put_object(self, **kw: Any) -> dict[str, Any]:
        self.calls += 1
        if self.calls <= self.failures:
            raise _error(self.code, self.status)
        return {}


def test_throttling_is_retried_then_raised_as_retriable():
    slept: list[float] = []
    flaky = Flaky("SlowDown", 503, 3)
    prepare_store(flaky, sleep=slept.append).put("s3://ctl/k", b"x")
    assert flaky.calls == 4 and slept == [0.5, 1.0, 2.0]
    always = Flaky("SlowDown", 503, 10**6)
    with pytest.raises(RetriableError, match="SlowDown"):
        prepare_store(always, sleep=lambda s: None).put("s3://ctl/k", b"x")
    assert always.calls == RETRIES + 1
    once = Flaky("SlowDown", 503, 10**6)  # a store made without retries: boto3's own only
    with pytest.raises(AwsRetriableError, match="writing s3://ctl/k: SlowDown") as exc:
        ObjectStore(once).put("s3://ctl/k", b"x")
    assert once.calls == 1 and exc.value.failure.kind is Kind.TRANSIENT


def test_denied_is_fatal_at_once():
    denied = Flaky("AccessDenied", 403, 10**6)
    with pytest.raises(AwsFatalError, match="writing s3://ctl/k: AccessDenied"):
        prepare_store(denied, sleep=lambda s: None).put("s3://ctl/k", b"x")
    assert denied.calls == 1


def test_local_store(tmp_path):
    store = ObjectStore()
    path = str(tmp_path / "a" / "b" / "obj")
    assert not store.exists(path) and store.get_if_exists(path) is None
    store.put(path, b"0123456789")
    assert store.exists(path) and store.size(path) == 10 and store.get(path) == b"0123456789"
    assert store.get_if_exists(path) == b"0123456789"
    assert store.get_range(path, 3, 6) == b"345" and store.get_range(path, 8, 20) == b"89"
    assert store.get_range(path, 20, 30) == b""
    assert store.get_tail(path, 4) == (b"6789", 10) and store.get_tail(path, 99) == (b"0123456789", 10)
    assert list(store.stream(path, 1, chunk=4)) == [b"1234", b"5678", b"9"]
    assert list(store.stream(path, 0, 8, chunk=4)) == [b"0123", b"4567"]
    assert os.listdir(tmp_path / "a" / "b") == ["obj"]  # no temporary file left behind
    store.copy(path, str(tmp_path / "a" / "copy"))
    assert store.get(str(tmp_path / "a" / "copy")) == b"0123456789"
    store.delete(path)
    store.delete(path)  # gone already: nothing to do
    assert not store.exists(path)


def test_a_local_listing_gives_sizes_in_order_and_skips_temporary_files(tmp_path):
    store = ObjectStore()
    store.put(f"{tmp_path}/out/b", b"bb")
    store.put(f"{tmp_path}/out/a/c", b"c")
    (tmp_path / "out" / ".b.x1y2").write_bytes(b"a killed writer's leftover")
    assert store.list(f"{tmp_path}/out/") == {f"{tmp_path}/out/a/c": 1, f"{tmp_path}/out/b": 2}
    assert list(store.list(f"{tmp_path}/out")) == [f"{tmp_path}/out/a/c", f"{tmp_path}/out/b"]
    assert store.list(f"{tmp_path}/none/") == {}


def test_ranged_reads_fetch_the_tail_once(tmp_path):
    data = bytes(range(256)) * 8  # 2 KiB
    (tmp_path / "obj").write_bytes(data)
    obj = RangedObject(ObjectStore(), str(tmp_path / "obj"), tail=512)
    assert obj.size() == len(data) and obj.requests == [(len(data) - 512, 512)]  # the size came with the tail
    assert obj.read(len(data) - 100, 50) == data[-100:-50] and obj.read(10, 20) == data[10:30]
    assert obj.requests == [(len(data) - 512, 512), (10, 20)]  # the tail served from memory
    with pytest.raises(ShardFormatError, match="outside"):
        obj.read(len(data) - 10, 20)
    # A size given (a listing's): no GET until a read, the tail fetched by the first read inside it.
    sized = RangedObject(ObjectStore(), str(tmp_path / "obj"), size=len(data), tail=512)
    fh = RangeFile(sized)
    assert fh.seek(-8, io.SEEK_END) == len(data) - 8 and sized.requests == []
    assert fh.read(100) == data[-8:] and sized.requests == [(len(data) - 512, 512)]
    fh.seek(0)
    assert fh.read(4) == data[:4] and fh.tell() == 4 and fh.read(0) == b""
