"""A whole node in-process: local plan/shard/output files, the images on moto's S3, crash and resume."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from gpu_worker.config import WorkerConfig
from gpu_worker.errors import RankFailed, WorkerError
from gpu_worker.main import run_node
from gpu_worker.output.commits import Paths, load_state
from sluice.aws.store import ObjectStore
from sluice.contracts.plan import RunPlan
from sluice.contracts.results import ShardError, ShardResult
from sluice.contracts.sections import ModelSpec
from sluice.local.emulator.server import free_port
from sluice.shards import encode_shard
from tests.plans import run_plan
from tests.worker_gets import Gets, moto_objects
from tests.worker_images import make_demo_images

IMAGES = dict(make_demo_images(60, seed=21))
KEYS = [*sorted(IMAGES), "gone.jpg"]


@pytest.fixture
def images() -> Iterator[Any]:
    """IMAGES in the bucket "bkt" of moto's S3 ("gone.jpg" is not there)."""
    yield from moto_objects("bkt", IMAGES)


@pytest.fixture
def run(tmp_path: Path, images):
    base = f"{tmp_path}/runs/r/"
    plan = run_plan(
        "r",
        base,
        total_keys=len(KEYS),
        model=ModelSpec(batch_size=4, image_size=32),
        job={"attempts": 2},
    )
    Path(base + "shards").mkdir(parents=True)
    Path(base + "shards/0.shard").write_bytes(encode_shard([("bkt", KEYS)], sort=False, block_keys=8))
    Path(base + "plan.json").write_text(plan.model_dump_json())
    env = {"SLUICE_PLAN_URI": base + "plan.json", "SLUICE_SHARD_INDEX": "0"}
    return plan, env


CFG = WorkerConfig(device="cpu", loaders=0, chunk_keys=7, fetch_concurrency=3, torch_threads=1)


def rows(plan: RunPlan) -> list[str]:
    out = []
    for f in sorted(Path(plan.output_prefix, "shard=0").glob("*.parquet")):
        out.extend(pq.read_table(f).column("key").to_pylist())
    return out


def test_node_processes_the_shard(run):
    plan, env = run
    result = run_node(CFG, env, store=ObjectStore())
    assert (result.processed, result.failed, result.ok) == (60, 1, True)
    assert ShardResult.model_validate_json(Path(plan.result_uri(0)).read_text()) == result
    assert sorted(rows(plan)) == sorted(f"s3://bkt/{k}" for k in IMAGES)
    assert result.chunks == 9  # ceil(61 / 7)
    assert Path(plan.failures_prefix, "0.jsonl").read_text().count("\n") == 1
    # A second run of a finished shard does nothing but rewrite the summary.
    with Gets(CFG, crash_after=0) as gets:
        again = run_node(CFG, {**env, "AWS_BATCH_JOB_ATTEMPT": "2"}, store=ObjectStore())
    assert (again.processed, again.resumed_chunks, again.stats, gets.calls) == (60, 9, {}, 0)


def test_a_rank_ends_what_it_started_and_frees_its_models_on_its_own_thread(run, monkeypatch):
    """No thread the rank started outlives it, and its torch models are freed on the rank's thread.

    A metrics thread left running held the models and freed them while the interpreter finalized:
    a tensor's dealloc releases the GIL, and a daemon thread taking it back then is ended inside
    that C++ frame, which aborts the process (std::terminate) after all its work was committed.
    """
    from gpu_worker.models import engine

    freed_on: list[str] = []
    init = engine.Engine.__init__

    def tracked(self: engine.Engine, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        weakref.finalize(self, lambda: freed_on.append(threading.current_thread().name))

    monkeypatch.setattr(engine.Engine, "__init__", tracked)
    before = set(threading.enumerate())
    _, env = run
    result = run_node(CFG.replace(metrics_port=free_port()), env, store=ObjectStore())
    assert result.ok
    assert [t.name for t in threading.enumerate() if t not in before] == []
    assert freed_on == [threading.current_thread().name]


def test_crash_then_resume_redoes_only_uncommitted_work(run):
    plan, env = run
    with pytest.raises((RankFailed, WorkerError), match="simulated crash"), Gets(CFG, crash_after=30):
        run_node(CFG, env, store=ObjectStore())
    # Its last words, for the outcome: Batch's event says only that the container exited.
    said = ShardError.model_validate_json(Path(plan.shards_prefix, "0.error.json").read_text())
    assert (said.shard, said.attempt, said.exit_code) == (0, 1, 1) and "simulated crash" in said.reason
    paths = Paths.for_shard(plan.output_prefix, plan.failures_prefix, plan.shards_prefix, 0)
    before = load_state(ObjectStore(), paths)
    assert 0 < len(before.markers) < 9
    stamps = {m.name: os.stat(paths.parquet(m.name)).st_mtime_ns for m in before.markers if m.file}
    Path(paths.parquet("part-0000-000000056")).write_bytes(b"orphan from the killed attempt")
    with Gets(CFG) as gets:
        result = run_node(CFG, {**env, "AWS_BATCH_JOB_ATTEMPT": "2"}, store=ObjectStore())
    assert result.ok and result.processed == 60 and result.resumed_chunks == len(before.markers)
    done_before = sum(b - a for m in before.markers for a, b in m.covers)
    assert gets.calls == len(KEYS) - done_before  # nothing fetched twice
    keys = rows(plan)
    assert len(keys) == len(set(keys)) == 60
    assert stamps, "attempt 1 committed no chunk"
    for name, stamp in stamps.items():
        assert os.stat(paths.parquet(name)).st_mtime_ns == stamp


def test_empty_shard(run, tmp_path):
    """An MNP run with fewer keys than nodes gives some nodes an empty shard: done at once, ok."""
    plan, env = run
    Path(plan.shards_prefix, "0.shard").write_bytes(encode_shard([]))
    with Gets(CFG, crash_after=0) as gets:
        result = run_node(CFG, env, store=ObjectStore())
    assert (result.n_keys, result.processed, result.failed, result.ok, gets.calls) == (0, 0, 0, True, 0)
    assert Path(plan.failures_prefix, "0.jsonl").read_text() == ""
