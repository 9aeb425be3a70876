"""A map worker reads a key list exactly as sluice.input.sources does: same keys, same reasons, same line numbers;
it routes a key to the same reduce partition every time."""

from __future__ import annotations

import csv
import json
import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.contracts.prepare import KeyListRange
from sluice.input.sources import Problems, keylist_pairs
from sluice.prepare import prepare_store
from sluice.prepare.mapper.keylist import map_keylist
from sluice.prepare.mapper.parts import Parts, TaskProblems, partitions_of
from sluice.prepare.mapper.router import KeyRouter
from sluice.shards import ShardReader
from tests.properties import examples

EXAMPLES = examples(12)


class AllProblems(Problems):
    """sluice.input.sources.Problems that keeps every reason and never stops the scan."""

    def add(self, reason: str) -> None:
        self.count += 1
        self.reasons.append(reason)


buckets = st.sampled_from(["img-a", "img-b", "Bad_B", "ab", "a..b", "x" * 64])
key_chars = st.sampled_from([*"abc/ .é\r\t,\"'", "\\", "日"])
keys = st.one_of(
    st.text(key_chars, min_size=0, max_size=8),
    st.just("k" * 300),
    st.just("é" * 300),
    st.just("dir/"),
)
entries = st.one_of(
    st.builds(lambda b, k: f"s3://{b}/{k}", buckets, keys),
    keys,
    st.sampled_from(["http://host/a.jpg", "", "   ", "s3://img-a", "s3:///k", "\r"]),
)


def _jsonl(entry: str, b: str, i: int) -> str:
    return [json.dumps(entry), json.dumps({"uri": entry}), json.dumps({"bucket": b, "key": entry}), "{bad", "[1]"][
        i % 5
    ]


@st.composite
def keylists(draw: st.DrawFn) -> tuple[str, bytes]:
    fmt = draw(st.sampled_from([".txt", ".csv", ".jsonl"]))
    es = draw(st.lists(entries, max_size=15))
    if fmt == ".txt":
        lines = [e.replace("\n", "") for e in es]
    elif fmt == ".csv":
        head = draw(st.sampled_from([[], ["bucket,key"], ["uri"], ["key"]]))
        lines = head + [f"{draw(buckets)},{e}" if draw(st.booleans()) else e for e in es]
    else:
        lines = [_jsonl(e, draw(buckets), i) for i, e in enumerate(es)]
    crlf = draw(st.booleans())
    return fmt, ("\r\n" if crlf else "\n").join(lines).encode()


@settings(max_examples=max(EXAMPLES, 50), deadline=None)
@given(keylists(), st.sampled_from([None, "dflt-bucket"]))
def test_map_reads_a_key_list_as_the_manifest_lambda_does(keylist, default):
    fmt, data = keylist
    uri = "keys" + fmt
    want_problems = AllProblems()
    try:
        want: list[tuple[str, str]] | None = sorted(keylist_pairs([data], uri, fmt, default, want_problems))
    except csv.Error:  # sluice.input.sources lets this escape; a map worker records it as the line's problem
        want = None
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, uri)
        with open(path, "wb") as fh:
            fh.write(data)
        problems = TaskProblems()
        parts = Parts(tmp, 1)
        sink = KeyRouter(parts, problems, frozenset(), None)
        lines = map_keylist(KeyListRange(uri=path, format=fmt, start=0, end=len(data)), prepare_store(), default, sink)
        parts.close()
        with open(parts.paths[0], "rb") as fh:
            got = sorted(ShardReader(fh.read()).pairs())
    if want is None:
        assert any("not CSV: new-line character seen in unquoted field" in p.reason for p in problems.kept)
        return
    assert got == want
    assert [f"{uri} line {p.line}: {p.reason}" for p in problems.kept] == want_problems.reasons
    assert lines == (data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0))


def test_partition_is_stable_and_spread():
    pairs = [("images", f"k/{i}.jpg") for i in range(4000)]
    parts = partitions_of(pairs, 8)
    assert parts == partitions_of(pairs, 8) and parts[17] == partitions_of([("images", "k/17.jpg")], 8)[0]
    counts = [parts.count(r) for r in range(8)]
    assert min(counts) > 400  # ~500 each
    assert partitions_of([("a", "b/c")], 1000) == [465]  # fixed forever: a retried worker must route alike
