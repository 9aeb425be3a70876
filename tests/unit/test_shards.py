"""Shard codec: round trips, random access, rank slices, corruption detection."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.errors import ShardFormatError
from sluice.shards import (
    FOOTER,
    HEADER,
    BytesSource,
    FileSource,
    ShardReader,
    ShardWriter,
    encode_shard,
    rank_slice,
)

bucket_names = st.sampled_from(["images", "other-bucket", "a.b.c"])
# Any Unicode text except lone surrogates (not encodable as UTF-8, so not S3 keys).
keys = st.text(st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=40)
groups = st.lists(st.tuples(bucket_names, st.lists(keys, max_size=30)), max_size=6)


def _flat(gs: list[tuple[str, list[str]]]) -> list[tuple[str, str]]:
    return [(b, k) for b, ks in gs for k in ks]


@settings(max_examples=200, deadline=None)
@given(groups, st.sampled_from(["zstd", "zlib", "none"]), st.integers(1, 9))
def test_unsorted_round_trip_keeps_order_and_buckets(gs, codec, block_keys):
    data = encode_shard(gs, sort=False, codec=codec, block_keys=block_keys)
    reader = ShardReader(data)
    assert reader.pairs() == _flat(gs)
    assert len(reader) == sum(len(k) for _, k in gs)


@settings(max_examples=200, deadline=None)
@given(groups, st.integers(1, 9))
def test_sorted_round_trip_is_same_multiset_sorted_per_bucket(gs, block_keys):
    reader = ShardReader(encode_shard(gs, sort=True, block_keys=block_keys))
    assert reader.pairs() == sorted(_flat(gs))
    assert reader.sorted


@settings(max_examples=200, deadline=None)
@given(groups, st.integers(1, 7), st.data())
def test_any_slice_equals_list_slice(gs, block_keys, data):
    reader = ShardReader(encode_shard(gs, sort=False, block_keys=block_keys))
    flat = _flat(gs)
    start = data.draw(st.integers(-2, len(flat) + 2))
    stop = data.draw(st.integers(-2, len(flat) + 2))
    assert reader.pairs(start, stop) == flat[max(start, 0) : max(stop, 0)]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 64), st.integers(1, 16))
def test_rank_slices_partition_exactly_for_any_world(n_keys, nodes, ranks):
    """Over (nodes x ranks) every position is covered once, in order, sizes within 1."""
    world = nodes * ranks
    covered = []
    sizes = []
    for node in range(nodes):
        for local in range(ranks):
            start, stop = rank_slice(n_keys, world, node * ranks + local)
            covered.extend(range(start, stop))
            sizes.append(stop - start)
    assert covered == list(range(n_keys))
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=100, deadline=None)
@given(st.lists(keys, max_size=200), st.integers(1, 8))
def test_rank_slices_of_a_real_shard_partition_its_keys(ks, world):
    reader = ShardReader(encode_shard([("images", ks)], sort=False, block_keys=7))
    parts = [reader.pairs(*rank_slice(len(reader), world, r)) for r in range(world)]
    assert [p for part in parts for p in part] == [("images", k) for k in ks]


def test_rank_slice_rejects_bad_rank():
    with pytest.raises(ValueError, match="outside world"):
        rank_slice(10, 2, 2)


def test_a_rank_reads_only_its_blocks():
    """Random access: reading a slice touches the index and only the overlapping blocks."""
    ks = [f"assets/{i:06d}.jpg" for i in range(10_000)]
    data = encode_shard([("images", ks)], sort=False, block_keys=100)

    class Counting(BytesSource):
        def __init__(self, d: bytes) -> None:
            super().__init__(d)
            self.bytes_read = 0

        def read(self, offset: int, length: int) -> bytes:
            self.bytes_read += length
            return super().read(offset, length)

    src = Counting(data)
    reader = ShardReader(src)
    after_index = src.bytes_read
    got = reader.pairs(5_000, 5_250)
    assert [k for _, k in got] == ks[5_000:5_250]
    block_bytes = src.bytes_read - after_index
    assert block_bytes < len(data) / 20  # 3 of 100 blocks, not the whole file


def test_keys_with_newlines_use_the_length_prefixed_block():
    ks = ["a\nb", "", "c\n", "plain"]
    assert ShardReader(encode_shard([("b", ks)], sort=False)).pairs() == [("b", k) for k in ks]


def test_file_source_and_stats(tmp_path):
    path = tmp_path / "x.shard"
    with open(path, "wb") as fh:
        w = ShardWriter(fh, block_keys=2)
        w.add("images", ["c", "a", "b"])
        stats = w.close()
    assert stats.n_keys == 3 and stats.n_blocks == 2 and stats.n_bytes == path.stat().st_size
    assert list(ShardReader(FileSource(path)).uris()) == ["s3://images/a", "s3://images/b", "s3://images/c"]


def test_empty_shard_round_trips():
    reader = ShardReader(encode_shard([]))
    assert len(reader) == 0 and reader.pairs() == []


def test_writer_refuses_use_after_close():
    w = ShardWriter(io.BytesIO())
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.add("b", ["k"])


def test_unknown_codec_is_a_clear_error():
    with pytest.raises(ValueError, match="codec must be one of"):
        ShardWriter(io.BytesIO(), codec="lz4")


@pytest.fixture
def good() -> bytes:
    return encode_shard([("images", [f"k/{i}" for i in range(500)])], sort=False, block_keys=50)


def test_flipped_byte_in_a_block_fails_its_checksum(good):
    bad = bytearray(good)
    bad[HEADER.size + 3] ^= 0xFF
    with pytest.raises(ShardFormatError, match="checksum"):
        ShardReader(bytes(bad)).pairs()


def test_flipped_byte_in_the_index_fails_the_index_checksum(good):
    bad = bytearray(good)
    bad[-FOOTER.size - 5] ^= 0xFF
    with pytest.raises(ShardFormatError, match="index checksum"):
        ShardReader(bytes(bad))


@pytest.mark.parametrize("cut", [1, 10, 100])
def test_truncated_shard_is_rejected(good, cut):
    with pytest.raises(ShardFormatError):
        ShardReader(good[:-cut])


def test_not_a_shard_and_future_version(good):
    with pytest.raises(ShardFormatError, match="bad magic"):
        ShardReader(b"x" * 100)
    future = bytearray(good)
    future[8] = 99  # version field
    with pytest.raises(ShardFormatError, match="version 99"):
        ShardReader(bytes(future))
    with pytest.raises(ShardFormatError, match="too short"):
        ShardReader(b"SLUICESH")
