"""Property: an incremental run's prepare stage keeps exactly the keys the lineage lacks, deterministically.

For random current objects (some missing), random earlier runs (rows of random versions per
key and model, some chunks left uncommitted by a killed attempt) and one or two models, the
shards hold exactly the keys for which some model's newest committed row is absent or of
another version; and running a map or reduce task twice (a Batch retry) writes the same bytes.
The real map and reduce code runs against in-process moto S3 (HEADs, listings, ranged reads).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count
from typing import Any

import boto3
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto import mock_aws

from sluice.contracts.prepare import EarlierOutput, InlineKeys, PrepareSpec
from sluice.paths import RunPaths
from sluice.prepare import prepare_store
from sluice.prepare.collect import collect
from sluice.prepare.mapper.worker import run_map
from sluice.prepare.reducer.versions import place_shards
from sluice.prepare.reducer.worker import run_reduce
from sluice.shards import ShardReader
from tests.integration.incremental_support import md5, write_chunk
from tests.properties import examples

CTL, IMAGES = "ctl", "imgs"
TIMING = {"seconds", "peak_rss_mb"}
EXAMPLES = count()

variant = st.one_of(st.none(), st.integers(0, 2))  # None: no object / no row


@st.composite
def cases(draw: Any) -> dict[str, Any]:
    n_keys = draw(st.integers(1, 8))
    n_models = draw(st.integers(1, 2))
    n_runs = draw(st.integers(1, 3))
    return {
        "current": draw(st.lists(variant, min_size=n_keys, max_size=n_keys)),
        "models": n_models,
        # runs[rank][model][key]: the row's version; committed[rank][model]: the second chunk's marker
        "rows": draw(
            st.lists(
                st.lists(st.lists(variant, min_size=n_keys, max_size=n_keys), min_size=n_models, max_size=n_models),
                min_size=n_runs,
                max_size=n_runs,
            )
        ),
        "committed": draw(st.lists(st.lists(st.booleans(), min_size=2, max_size=2), min_size=n_runs, max_size=n_runs)),
        "partitions": draw(st.integers(1, 3)),
        "keys_per_shard": draw(st.integers(1, 4)),
    }


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=CTL)
        client.create_bucket(Bucket=IMAGES)
        yield client


def _setup(s3: Any, case: dict[str, Any], ex: int) -> tuple[PrepareSpec, list[str]]:
    store = prepare_store(s3)
    keys = [f"ex{ex}/{i}.jpg" for i in range(len(case["current"]))]
    for k, v in zip(keys, case["current"], strict=True):
        if v is not None:
            s3.put_object(Bucket=IMAGES, Key=k, Body=f"{k}:{v}".encode())
    model_ids = [f"model-{m}" for m in range(case["models"])]
    earlier = []
    for rank, by_model in enumerate(case["rows"]):
        for m, versions in enumerate(by_model):
            prefix = f"s3://{CTL}/ex{ex}/runs/r{rank}/output/" + (f"model_name=m{m}/" if case["models"] > 1 else "")
            rows = [
                (f"s3://{IMAGES}/{k}", md5(f"{k}:{v}".encode()), None) for k, v in zip(keys, versions) if v is not None
            ]
            half = len(rows) // 2
            for c, chunk in enumerate((rows[:half], rows[half:])):
                if chunk:
                    committed = case["committed"][rank][m] or c == 0
                    write_chunk(
                        store,
                        prefix + "shard=0/",
                        f"part-0000-{c:09d}",
                        chunk,
                        f"m{m}",
                        model_ids[m],
                        f"r{rank}",
                        committed=committed,
                    )
            earlier.append(
                EarlierOutput(run_id=f"r{rank}", rank=rank, model_prefix=prefix, model_id=model_ids[m], start=0, stop=1)
            )
    pairs = [(IMAGES, k) for k in keys]
    spec = PrepareSpec(
        run_id=f"ex{ex}",
        manifest_uri=f"s3://{CTL}/manifests/ex{ex}.json",
        root=f"s3://{CTL}/ex{ex}/runs/new/",
        workers=2,
        partitions=case["partitions"],
        keys_per_shard=case["keys_per_shard"],
        max_keys=10**6,
        tasks=[InlineKeys(pairs=pairs[: len(pairs) // 2]), InlineKeys(pairs=pairs[len(pairs) // 2 :])],
        since_run="r0",
        lineage=[f"r{r}" for r in range(len(case["rows"]))],
        model_ids=model_ids,
        earlier=earlier,
    )
    return spec, keys


def _expected(case: dict[str, Any], keys: list[str]) -> set[str]:
    """Keys some model's newest committed row does not hold at the current version (or with no object)."""
    kept = set()
    for i, k in enumerate(keys):
        cur = case["current"][i]
        for m in range(case["models"]):
            newest = None
            for rank, by_model in enumerate(case["rows"]):
                present = [j for j, v in enumerate(by_model[m]) if v is not None]
                second = set(present[len(present) // 2 :])
                visible = i in present and (i not in second or case["committed"][rank][m])
                if visible:
                    newest = by_model[m][i]
                    break
            if cur is None or newest != cur:
                kept.add(k)
    return kept


def _objects(s3: Any, prefix: str) -> dict[str, bytes]:
    resp = s3.list_objects_v2(Bucket=CTL, Prefix=prefix)
    return {o["Key"]: s3.get_object(Bucket=CTL, Key=o["Key"])["Body"].read() for o in resp.get("Contents", [])}


@settings(max_examples=examples(15), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_the_kept_keys_are_exactly_those_the_lineage_lacks_and_retries_write_the_same_bytes(
    s3: Any, case: dict
) -> None:
    ex = next(EXAMPLES)
    spec, keys = _setup(s3, case, ex)
    store = prepare_store(s3)
    root = spec.root.removeprefix(f"s3://{CTL}/")
    for w in range(spec.workers):
        first = run_map(spec, w, store).model_dump(exclude=TIMING)
        parts = _objects(s3, root + f"prepare/map/{w}/")
        assert run_map(spec, w, store).model_dump(exclude=TIMING) == first
        assert _objects(s3, root + f"prepare/map/{w}/") == parts, "a retried map worker rewrites the same parts"
    for r in range(spec.partitions):
        first = run_reduce(spec, r, store).model_dump(exclude=TIMING)
        staged = _objects(s3, root + f"prepare/reduce/{r}/")
        assert run_reduce(spec, r, store).model_dump(exclude=TIMING) == first
        assert _objects(s3, root + f"prepare/reduce/{r}/") == staged, "a retried reducer rewrites the same shards"
    got = collect(spec, store)
    want = _expected(case, keys)
    if not want:
        assert got.rejected and "nothing to embed" in got.rejected[0]
        return
    assert got.rejected is None, got.rejected
    place_shards(spec, got.pieces, store)
    place_shards(spec, got.pieces, store)  # the submit step retried
    paths = RunPaths(spec.root)
    shards = [ShardReader(store.get(paths.shard(i))).pairs() for i in range(got.n_shards)]
    embedded = [k for shard in shards for _, k in shard]
    assert sorted(embedded) == sorted(want), "each key to embed exactly once, and no other"
    assert got.skipped == {"unchanged": len(keys) - len(want)}
    assert all(0 < len(s) <= spec.keys_per_shard for s in shards)
