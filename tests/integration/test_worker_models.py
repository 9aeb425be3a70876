"""Several models in one pass: one fetch and decode per key, each model's own output, markers and resume."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from gpu_worker.errors import RankFailed, WorkerError
from gpu_worker.main import run_node
from gpu_worker.output.commits import Paths, load_state
from sluice.aws.store import ObjectStore
from sluice.contracts.plan import RunPlan
from sluice.contracts.sections import ModelSpec
from sluice.shards import encode_shard
from tests.integration.test_worker_node import CFG, IMAGES, KEYS
from tests.plans import run_plan
from tests.worker_gets import Gets, moto_objects

SMALL = ModelSpec(uri="builtin:reference-cnn", batch_size=4, image_size=32, name="small")
BIG = ModelSpec(uri="builtin:reference-cnn", batch_size=6, image_size=48, name="big")


@pytest.fixture(autouse=True)
def images() -> Iterator[Any]:
    """IMAGES in the bucket "bkt" of moto's S3."""
    yield from moto_objects("bkt", IMAGES)


def _plan(tmp_path: Path, name: str, models: list[ModelSpec]) -> tuple[RunPlan, dict[str, str]]:
    base = f"{tmp_path}/{name}/"
    plan = run_plan(name, base, total_keys=len(KEYS), model=models, job={"attempts": 2})
    Path(base + "shards").mkdir(parents=True)
    Path(base + "shards/0.shard").write_bytes(encode_shard([("bkt", KEYS)], sort=False, block_keys=8))
    Path(base + "plan.json").write_text(plan.model_dump_json())
    return plan, {"SLUICE_PLAN_URI": base + "plan.json", "SLUICE_SHARD_INDEX": "0"}


def _table(plan: RunPlan, m: int) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for f in sorted(Path(plan.output_dir(0, m)).glob("*.parquet")):
        for row in pq.read_table(f).to_pylist():
            assert row["key"] not in out, f"{row['key']} written twice"
            out[row["key"]] = row
    return out


def test_each_key_is_fetched_once_and_embedded_by_every_model(tmp_path):
    plan, env = _plan(tmp_path, "two", [SMALL, BIG])
    with Gets(CFG) as gets:
        result = run_node(CFG, env, store=ObjectStore())
    assert gets.calls == len(KEYS)  # one GET per key for both models
    assert result.ok and result.processed_by_model == {"small": 60, "big": 60} and result.failed == 1
    assert plan.output_dir(0, 0).endswith("/output/model_name=small/shard=0/")
    small, big = _table(plan, 0), _table(plan, 1)
    assert set(small) == set(big) == {f"s3://bkt/{k}" for k in IMAGES}
    assert {r["model"] for r in small.values()} == {"small"} and {r["model"] for r in big.values()} == {"big"}
    # One builtin at two sizes: two models, whose vectors are not comparable (sluice.modelid).
    assert {r["model_id"] for r in big.values()} == {"builtin:reference-cnn@1;image_size=48"}
    assert {r["model_id"] for r in small.values()} == {"builtin:reference-cnn@1;image_size=32"}
    assert {r["size"] for r in small.values()} == {len(b) for b in IMAGES.values()}
    assert Path(plan.failures_prefix, "0.jsonl").read_text().count("\n") == 1  # gone.jpg, once


def test_a_smaller_model_sees_what_decoding_at_its_own_size_gives(tmp_path):
    """Derived preprocessing: the 48 px decode resized to 32 px embeds like a 32 px decode."""
    pair, env2 = _plan(tmp_path, "pair", [SMALL, BIG])
    alone, env1 = _plan(tmp_path, "alone", [SMALL])
    run_node(CFG, env2, store=ObjectStore())
    run_node(CFG, env1, store=ObjectStore())
    derived, own = _table(pair, 0), _table(alone, 0)
    assert alone.output_dir(0).endswith("/output/shard=0/")  # one model: the one-model layout
    cos = [float(np.dot(derived[k]["embedding"], own[k]["embedding"])) for k in own]
    assert min(cos) > 0.95 and float(np.median(cos)) > 0.99, (min(cos), float(np.median(cos)))
    keys = sorted(own)
    unrelated = [float(np.dot(own[a]["embedding"], own[b]["embedding"])) for a, b in itertools.pairwise(keys)]
    assert float(np.median(unrelated)) < 0.9  # so the check above can fail: other images embed far apart


def test_models_resume_on_their_own(tmp_path):
    """A model whose output is gone is redone alone: the other model's chunks are not touched or refetched."""
    plan, env = _plan(tmp_path, "resume", [SMALL, BIG])
    run_node(CFG, env, store=ObjectStore())
    small_dir = Path(plan.output_dir(0, 0))
    stamps = {p.name: p.stat().st_mtime_ns for p in small_dir.glob("*.parquet")}
    shutil.rmtree(plan.output_dir(0, 1))
    with Gets(CFG) as gets:
        result = run_node(CFG, {**env, "AWS_BATCH_JOB_ATTEMPT": "2"}, store=ObjectStore())
    assert gets.calls == len(KEYS) and result.processed_by_model == {"small": 60, "big": 60}
    assert {p.name: p.stat().st_mtime_ns for p in small_dir.glob("*.parquet")} == stamps
    assert len(_table(plan, 1)) == 60


def test_crash_then_resume_fetches_what_any_model_still_needs(tmp_path):
    plan, env = _plan(tmp_path, "crash", [SMALL, BIG])
    with pytest.raises((RankFailed, WorkerError), match="simulated crash"), Gets(CFG, crash_after=30):
        run_node(CFG, env, store=ObjectStore())
    states = [
        load_state(
            ObjectStore(), Paths.for_shard(plan.model_output_prefix(m), plan.failures_prefix, plan.shards_prefix, 0)
        )
        for m in (0, 1)
    ]
    done_by_both = set.intersection(
        *({p for m in st.markers for a, b in m.covers for p in range(a, b)} for st in states)
    )
    with Gets(CFG) as gets:
        result = run_node(CFG, {**env, "AWS_BATCH_JOB_ATTEMPT": "2"}, store=ObjectStore())
    assert result.ok and result.processed_by_model == {"small": 60, "big": 60}
    assert gets.calls == len(KEYS) - len(done_by_both)
    assert len(_table(plan, 0)) == len(_table(plan, 1)) == 60
    assert os.path.exists(plan.result_uri(0))
