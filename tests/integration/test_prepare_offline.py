"""The prepare stage on a local directory: `sluice prepare` offline, a killed worker process, rank slices."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.contracts.plan import RunPlan
from sluice.contracts.prepare import PrepareSpec
from sluice.errors import Rejection
from sluice.paths import RunPaths
from sluice.plan.layout import job_layouts
from sluice.prepare import prepare_store
from sluice.prepare.mapper.worker import run_map
from sluice.prepare.offline import OfflineJob, add_offline_arguments, offline_main, prepare_offline
from sluice.prepare.reducer.worker import run_reduce
from sluice.prepare.split import estimate_keylist, keylist_tasks
from sluice.shards import FileSource, ShardReader, rank_slice
from tests import pace
from tests.properties import examples

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = examples(12)


def write_keylist(path: Path, n: int, seed: int = 3) -> list[str]:
    """n s3:// URIs, ~5% repeating an earlier one, over three buckets."""
    rnd = random.Random(seed)
    uris: list[str] = []
    for i in range(n):
        if uris and rnd.random() < 0.05:
            uris.append(uris[rnd.randrange(len(uris))])
        else:
            uris.append(f"s3://img{i % 3}/assets/2024-05-{i % 28:02d}/{rnd.getrandbits(96):024x}.jpg")
    path.write_text("\n".join(uris) + "\n")
    return uris


def read_shards(out: Path, n: int) -> list[list[tuple[str, str]]]:
    return [ShardReader(FileSource(out / "shards" / f"{i}.shard")).pairs() for i in range(n)]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], dict[str, object]]:
    base = tmp_path_factory.mktemp("offline")
    uris = write_keylist(base / "keys.txt", 6000)
    summary = prepare_offline(
        OfflineJob(str(base / "keys.txt"), str(base / "out"), 2, keys_per_shard=700, partitions=3)
    )
    return base, uris, summary


def test_offline_shards_and_plan(prepared):
    base, uris, summary = prepared
    unique = {tuple(u[5:].split("/", 1)) for u in uris}
    assert {k: summary[k] for k in ("workers", "partitions", "keys_in", "unique_keys", "duplicates")} == {
        "workers": 2,
        "partitions": 3,
        "keys_in": len(uris),
        "unique_keys": len(unique),
        "duplicates": len(uris) - len(unique),
    }
    n = int(summary["shards"])  # type: ignore[call-overload]
    shards = read_shards(base / "out", n)
    assert sorted(p for s in shards for p in s) == sorted(unique)
    assert sorted(os.listdir(base / "out" / "shards")) == sorted(f"{i}.shard" for i in range(n))
    assert not (base / "out" / "prepare" / "map").exists()  # intermediate parts removed
    plan = RunPlan.model_validate_json((base / "out" / "plan.json").read_text())
    assert (plan.total_keys, plan.duplicates, plan.n_shards) == (len(unique), len(uris) - len(unique), n)
    assert plan.shard_uri(0) == str(base / "out" / "shards" / "0.shard")
    assert [j.model_dump() for j in plan.jobs] == [{"kind": "array", "shard_offset": 0, "shard_count": n}]
    assert float(summary["peak_rss_mb_per_worker"]) > 10  # type: ignore[arg-type]
    # in-process with other workers: the same shards, byte for byte
    again = prepare_offline(
        OfflineJob(str(base / "keys.txt"), str(base / "again"), 3, keys_per_shard=700, partitions=3, processes=False)
    )
    assert again["shards"] == n
    for i in range(n):
        assert (base / "again" / "shards" / f"{i}.shard").read_bytes() == (
            base / "out" / "shards" / f"{i}.shard"
        ).read_bytes()


@settings(max_examples=EXAMPLES, deadline=None)
@given(world=st.integers(1, 16))
def test_rank_slices_partition_every_shard(prepared, world):
    """A worker's ranks (an array child's GPUs, or an MNP node's) each take rank_slice of its shard."""
    base, _, summary = prepared
    for i in range(int(summary["shards"])):  # type: ignore[call-overload]
        reader = ShardReader(FileSource(base / "out" / "shards" / f"{i}.shard"))
        slices = [rank_slice(len(reader), world, rank) for rank in range(world)]
        assert max(hi - lo for lo, hi in slices) - min(hi - lo for lo, hi in slices) <= 1
        assert [p for lo, hi in slices for p in reader.pairs(lo, hi)] == reader.pairs()


def test_job_layout():
    assert [j.shard_count for j in job_layouts(25_000, "array", 10_000)] == [10_000, 10_000, 5_000]
    assert [j.shard_offset for j in job_layouts(25_000, "array", 10_000)] == [0, 10_000, 20_000]
    assert [j.kind for j in job_layouts(10_001, "array", 10_000)] == ["array", "single"]
    assert [j.kind for j in job_layouts(4, "multinode", 10_000)] == ["multinode"]


def test_offline_main_and_bad_input(tmp_path, capsys):
    (tmp_path / "keys.txt").write_text("a.jpg\nb.jpg\n\nsub/c.jpg\na.jpg\n")
    p = argparse.ArgumentParser()
    add_offline_arguments(p)
    args = p.parse_args(
        [str(tmp_path / "keys.txt"), "--out", str(tmp_path / "out"), "--workers", "2", "--bucket", "imgs", "--json"]
    )
    assert offline_main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (summary["unique_keys"], summary["duplicates"], summary["shards"]) == (3, 1, 1)
    assert read_shards(tmp_path / "out", 1) == [[("imgs", "a.jpg"), ("imgs", "b.jpg"), ("imgs", "sub/c.jpg")]]
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["jobs"] == [
        {"kind": "single", "shard_offset": 0, "shard_count": 1}
    ]
    with pytest.raises(Rejection) as exc:
        prepare_offline(OfflineJob(str(tmp_path / "keys.txt"), str(tmp_path / "nob"), 2, processes=False))
    assert exc.value.reasons[0].startswith("keys.txt line 1: bare key 'a.jpg' but no bucket")
    assert len(exc.value.reasons) == 4  # every bare key, in line order, from both workers


def test_killed_map_process_reruns_to_the_same_bytes(tmp_path):
    """SIGKILL a real `python -m sluice.prepare map` while it writes its parts; the rerun writes the same bytes."""
    write_keylist(tmp_path / "keys.txt", 150_000, seed=8)
    path = str(tmp_path / "keys.txt")
    est = estimate_keylist(prepare_store(), path)
    tasks = list(keylist_tasks(path, est.size, est.format, est.header, 2))

    def spec(root: str) -> PrepareSpec:
        return PrepareSpec(
            run_id="k",
            manifest_uri=path,
            root=root,
            workers=2,
            partitions=32,
            keys_per_shard=2000,
            max_keys=10**9,
            tasks=tasks,
        )

    ref, run = spec(str(tmp_path / "ref") + "/"), spec(str(tmp_path / "run") + "/")
    for w in range(2):
        run_map(ref, w, prepare_store())
    for r in range(32):
        run_reduce(ref, r, prepare_store())
    spec_path = RunPaths(run.root).prepare_spec
    prepare_store().put(spec_path, run.model_dump_json().encode())
    # TMPDIR: the killed process cannot remove its spill folder; tmp_path goes with the test.
    env = {**os.environ, "AWS_BATCH_JOB_ARRAY_INDEX": "1", "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "sluice.prepare", "map", "--spec", spec_path]
    parts_dir = Path(run.root) / "prepare" / "map" / "1"
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + pace.scaled(60)  # a guard against a hang (tests/pace.py)
    while not parts_dir.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_early = not Path(RunPaths(run.root).map_result(1)).exists()
    assert killed_early, "the worker finished before the kill: make the input bigger"
    some = sorted(parts_dir.glob("*.part"))
    if some:  # a previous attempt's damage: the retry must overwrite it
        some[0].write_bytes(b"not a part")
    assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    run_map(run, 0, prepare_store())
    paths, ref_paths = RunPaths(run.root), RunPaths(ref.root)
    for w in range(2):
        for r in range(32):
            assert Path(paths.prepare_part(w, r)).read_bytes() == Path(ref_paths.prepare_part(w, r)).read_bytes()
    for r in range(32):
        res = run_reduce(run, r, prepare_store())
        for i in range(res.first_shard, res.first_shard + len(res.shard_keys)):
            assert Path(paths.shard(i)).read_bytes() == Path(ref_paths.shard(i)).read_bytes()
