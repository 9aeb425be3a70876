"""`sluice local run` as a person runs it: a real subprocess, a real moto server, real workers."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from PIL import Image

from tests import pace
from tests.worker_images import make_demo_images

LOCAL_RUN = [sys.executable, "-m", "sluice.cli", "local", "run"]


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.cli", "local", "run", *args], capture_output=True, text=True, timeout=timeout
    )


def _rows(out_dir: str) -> list[dict]:
    files = sorted(Path(out_dir, "output").rglob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def readme_recipe(output: Path) -> tuple[int, int, list[str], int]:
    """The README's recipe over a run's output folder: (pyarrow's rows, duckdb's rows, models, embedding width)."""
    t = ds.dataset(output, format="parquet", partitioning="hive").to_table()  # README, pyarrow
    n = duckdb.sql(f"SELECT count(*) FROM read_parquet('{output}/**/*.parquet', hive_partitioning = true)")
    return (
        t.num_rows,
        n.fetchall()[0][0],
        sorted(set(t.column("model").to_pylist())),
        t.schema.field("embedding").type.list_size,
    )


def test_a_demo_run_in_three_shards_embeds_every_image_once_and_reads_as_the_readme_says(tmp_path):
    """A --demo run as a 3-shard array; the README's recipe reads it (a two-model run alike: test_local_run_models)."""
    proc = _run("--demo", "64", "--shards", "3", "--json", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert s["outcome"] == "succeeded" and s["processed"] == 64 and s["failed"] == 0
    assert s["shards"] == 3
    assert "Run Submitted" in s["events"] and s["events"].count("Run Succeeded") == 1
    rows = _rows(s["output_dir"])
    keys = [r["key"] for r in rows]
    assert len(keys) == 64 == len(set(keys))
    assert all(len(r["embedding"]) == len(rows[0]["embedding"]) > 0 for r in rows)
    # pyarrow's hive dataset and duckdb: rows = images x models, the builtin's width.
    assert readme_recipe(Path(s["output_dir"], "output")) == (64, 64, ["reference-cnn"], 128)


def _jpeg(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40 + seed % 50, 30 + seed % 70), (seed * 7 % 256, 90, 160)).save(buf, "JPEG")
    return buf.getvalue()


def _folder(root: Path, good: int, corrupt: int, non_image: int) -> None:
    for i in range(good):
        sub = root / ("cats" if i % 2 else "dogs")
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"{i}.jpg").write_bytes(_jpeg(i))
    for i in range(corrupt):
        (root / f"broken-{i}.jpg").write_bytes(_jpeg(i)[:60])  # truncated JPEG
    for i in range(non_image):
        (root / f"notes-{i}.jpg").write_text("this is not an image\n" * 10)


def test_a_folder_with_a_few_bad_files_goes_through_the_prepare_stage_and_ends_with_its_index(tmp_path):
    """--images DIR through the prepare stage (3 workers), decoded on the CPU (--decode cpu): the bad files
    are listed with their reasons, every readable image is embedded exactly once, subfolders kept. Beside
    the small flat JPEGs, 12 unseen photo-like ones of 60-300 px that the decode scales down.

    The run ends with its index (the index stage's job, run by the local executor after "Run Succeeded",
    copied to OUT/<run id>/index/): one `sluice search` process embeds each unseen photo again with the
    index's own model and finds it first."""
    _folder(tmp_path / "imgs", good=196, corrupt=3, non_image=1)  # 2 shards: each under 5% failed
    unseen = tmp_path / "imgs" / "unseen"
    unseen.mkdir()
    for name, data in make_demo_images(12, seed=31337, min_side=60, max_side=300):
        (unseen / name).write_bytes(data)
    args = ("--images", str(tmp_path / "imgs"), "--prepare-workers", "3", "--shards", "2", "--decode", "cpu")
    proc = _run(*args, "--json", "--no-prometheus", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = json.loads(proc.stdout)
    assert (s["outcome"], s["processed"], s["failed"]) == ("succeeded", 208, 4)
    assert s["failed_by_reason"] == {"corrupt": 3, "not_image": 1}
    assert s["events"].index("Run Preparing") < s["events"].index("Run Submitted")
    p = s["prepare"]
    assert (p["workers"], p["keys_in"], p["unique_keys"], p["duplicates"]) == (3, 212, 212, 0)
    assert p["shards"] == s["shards"] and p["peak_rss_mb_per_worker"] > 0
    keys = [r["key"] for r in _rows(s["output_dir"])]
    assert len(keys) == 208 == len(set(keys)) and all(k.endswith(".jpg") for k in keys)
    assert {k.rsplit("/", 2)[-2] for k in keys} == {"cats", "dogs", "unseen"}  # subfolders kept as key prefixes

    assert s["events"][-2:] == ["Run Succeeded", "Run Indexed"], s["events"]
    assert s["index"] == os.path.join(s["output_dir"], "index") and s["index_rows"] == 208
    assert re.fullmatch(r"s3://.+/indexes/local-images-\d{8}-\d{6}-[0-9a-f]{4}/", s["index_uri"])  # its own
    photos = sorted(unseen.iterdir())
    queries = [a for photo in photos for a in ("--image", str(photo))]
    found = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "search", s["index"], *queries, "-k", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert found.returncode == 0, found.stderr[-3000:]
    results = json.loads(found.stdout)["results"]
    assert len(results) == len(photos) == 12
    for photo, hits in zip(photos, results, strict=True):
        assert hits[0]["key"].endswith("/unseen/" + photo.name), (photo.name, hits)
        assert hits[0]["score"] > 0.99


def test_bad_manifest_exits_non_zero_with_reason(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "input": {"keys": ["a.jpg"]}, "typo": true}')
    proc = _run("--demo", "1", "--manifest", str(bad))
    assert proc.returncode == 1
    said = proc.stdout + proc.stderr  # refused before anything starts: on stderr, as the other refusals
    assert "typo: unknown field" in said and "rejected" in said


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=["sigint", "sighup-closed-terminal"])
def test_a_stop_signal_stops_everything_and_the_run_still_gets_its_summary(tmp_path, sig):
    pid_file, scratch, out = tmp_path / "pids", tmp_path / "tmp", tmp_path / "out"
    scratch.mkdir()
    proc = subprocess.Popen(
        [*LOCAL_RUN, "--demo", "400", "--shards", "2", "--pid-file", str(pid_file), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(scratch)},  # where the servers' folders go: none may be left
    )
    deadline = time.monotonic() + pace.scaled(120)
    need = 3 if shutil.which("prometheus") else 2  # the server, Prometheus if on PATH, and a worker
    while time.monotonic() < deadline:  # wait until the server and at least one worker run
        if pid_file.exists() and len(pid_file.read_text().split()) >= need:
            break
        time.sleep(0.2)
    pids = [int(p) for p in pid_file.read_text().split()]
    assert len(pids) >= need
    time.sleep(1.0)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=pace.scaled(60))  # a guard against a hang, not a speed check
    assert proc.returncode == 130
    assert "interrupted" in err
    # Everything it started is gone once it has exited (it waits for each), its folders too.
    assert [p for p in pids if _alive(p)] == []
    assert sorted(p.name for p in scratch.iterdir() if p.name.startswith("sluice-")) == []
    (summary,) = out.glob("*/summary.json")  # concluded, not left RUNNING
    s = json.loads(summary.read_text())
    assert s["interrupted"] is True and s["outcome"] == "failed", s
    assert s["processed"] < 400, s  # stopped part way: it did not wait for the run to end


def test_sigint_while_uploading_stops_at_once(tmp_path):
    pid_file = tmp_path / "pids"
    # 20,000 images take minutes to make and upload on any machine: a run that went on uploading
    # after the signal would outlast the guard below many times over.
    cmd = [sys.executable, "-m", "sluice.cli", "local", "run", "--demo", "20000", "--pid-file", str(pid_file)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    deadline = time.monotonic() + pace.scaled(120)
    while time.monotonic() < deadline and not (pid_file.exists() and pid_file.read_text().split()):
        time.sleep(0.1)
    time.sleep(1.0)  # making the stack or uploading: before the run is submitted either way
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=pace.scaled(60))
    assert proc.returncode == 130, err[-2000:]
    assert "sluice: run " not in err  # it never got to submitting: stopped in the upload, not after it
    pids = [int(p) for p in pid_file.read_text().split()]
    assert [p for p in pids if _alive(p)] == []
