"""The prepare stage's store: S3 and local directories alike; transient S3 errors retried, others fatal."""

from __future__ import annotations

import os
from typing import Any

import pytest
from botocore.exceptions import ClientError

from sluice.aws.errors import AwsFatalError
from sluice.errors import RetriableError
from sluice.prepare.mapper.parts import partitions_of
from sluice.prepare.store import RETRIES, PrepareStore


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
    PrepareStore(flaky, sleep=slept.append).put("s3://ctl/k", b"x")
    assert flaky.calls == 4 and slept == [0.5, 1.0, 2.0]
    always = Flaky("SlowDown", 503, 10**6)
    with pytest.raises(RetriableError, match="SlowDown"):
        PrepareStore(always, sleep=lambda s: None).put("s3://ctl/k", b"x")
    assert always.calls == RETRIES + 1


def test_denied_is_fatal_at_once():
    denied = Flaky("AccessDenied", 403, 10**6)
    with pytest.raises(AwsFatalError, match="writing s3://ctl/k: AccessDenied"):
        PrepareStore(denied, sleep=lambda s: None).put("s3://ctl/k", b"x")
    assert denied.calls == 1


def test_local_store(tmp_path):
    store = PrepareStore()
    path = str(tmp_path / "a" / "b" / "obj")
    assert not store.exists(path)
    store.put(path, b"0123456789", scratch=True)
    assert store.exists(path) and store.size(path) == 10 and store.get(path) == b"0123456789"
    assert store.get_range(path, 3, 6) == b"345" and store.get_range(path, 8, 20) == b"89"
    assert store.get_range(path, 20, 30) == b""
    assert list(store.stream(path, 1, chunk=4)) == [b"1234", b"5678", b"9"]
    assert list(store.stream(path, 0, 8, chunk=4)) == [b"0123", b"4567"]
    assert os.listdir(tmp_path / "a" / "b") == ["obj"]  # no temporary file left behind


def test_partition_is_stable_and_spread():
    pairs = [("images", f"k/{i}.jpg") for i in range(4000)]
    parts = partitions_of(pairs, 8)
    assert parts == partitions_of(pairs, 8) and parts[17] == partitions_of([("images", "k/17.jpg")], 8)[0]
    counts = [parts.count(r) for r in range(8)]
    assert min(counts) > 400  # ~500 each
    assert partitions_of([("a", "b/c")], 1000) == [465]  # fixed forever: a retried worker must route alike
