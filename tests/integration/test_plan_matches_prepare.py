"""`sluice plan` and `sluice prepare` on the same key list: the same shards, shard size, timeout and stall time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.cli import main
from sluice.contracts.plan import RunPlan
from sluice.preflight.checks import TIMEOUT_FLOOR_S, derived_timeout_s
from sluice.prepare.offline import OfflineJob, prepare_offline
from sluice.settings import Settings

RATE = 50  # images/s a GPU (SLUICE_IMAGES_PER_GPU_S): small, so a few hundred thousand keys make several shards


@pytest.fixture()
def keylist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SLUICE_IMAGES_PER_GPU_S", str(RATE))
    monkeypatch.setenv("SLUICE_DEFAULT_MODEL_URI", "builtin:reference-cnn")
    path = tmp_path / "keys.txt"
    path.write_text("".join(f"s3://bucket-a/img/{i:08d}.jpg\n" for i in range(200_000)))
    return path


def _prepared(keylist: Path, out: Path, keys_per_shard: int | None = None) -> RunPlan:
    job = OfflineJob(
        str(keylist), str(out), 2, keys_per_shard=keys_per_shard, processes=False, settings=Settings.from_env()
    )
    prepare_offline(job)
    return RunPlan.model_validate_json((out / "plan.json").read_text())


def test_plan_and_prepare_agree_on_the_same_keys(keylist, tmp_path, capsys):
    assert main(["plan", str(keylist), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    prepared = _prepared(keylist, tmp_path / "out")
    assert planned["unique_keys"] == prepared.total_keys == 200_000
    assert (planned["shards"], planned["keys_per_shard"]) == (prepared.n_shards, prepared.keys_per_shard)
    assert (planned["timeout_s"], planned["stall_after_s"]) == (prepared.timeout_s, prepared.stall_after_s)
    assert planned["shards"] > 1 and planned["keys_per_shard_why"].startswith("chosen")
    assert prepared.timeout_s >= TIMEOUT_FLOOR_S  # derived (at least 6 h), never a fixed 3,600 s


def test_a_given_shard_size_is_kept_and_the_timeout_derived_from_it(keylist, tmp_path):
    prepared = _prepared(keylist, tmp_path / "out", keys_per_shard=10_000)
    assert (prepared.n_shards, prepared.keys_per_shard) == (20, 10_000)
    assert prepared.timeout_s == derived_timeout_s(10_000, 1, RATE) >= TIMEOUT_FLOOR_S


def test_with_duplicates_the_plan_of_a_staged_input_sizes_shards_from_the_keys_read(
    keylist, tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("SLUICE_PREPARE_OVER_KEYS", "1000")  # so the input goes to the prepare stage
    with keylist.open("a") as fh:  # 10,000 keys again: 210,000 read, 200,000 unique
        fh.write("".join(f"s3://bucket-a/img/{i:08d}.jpg\n" for i in range(0, 200_000, 20)))
    assert main(["plan", str(keylist), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    prepared = _prepared(keylist, tmp_path / "out")
    assert (planned["unique_keys"], prepared.total_keys, prepared.duplicates) == (200_000, 200_000, 10_000)
    assert (planned["shards"], planned["keys_per_shard"]) == (prepared.n_shards, prepared.keys_per_shard)
    assert (planned["timeout_s"], planned["stall_after_s"]) == (prepared.timeout_s, prepared.stall_after_s)
