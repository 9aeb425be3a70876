"""Two real `sluice local run`s on one emulator, the second incremental (input.since_run), then the read recipe.

Run 1 embeds a folder of images. One image is then edited and one added; run 2 names run 1
in since_run and goes through the real prepare jobs (the local executor runs them), which
skip the unchanged images; its workers embed the other two. `sluice output sql RUN2 --local
OUT`, run by duckdb over both runs' real output, returns every image once, each from the run
that embedded its current bytes.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import boto3
import duckdb

from tests.e2e.test_local_run import _alive, _jpeg

CLI = [sys.executable, "-m", "sluice.cli"]
IMAGES = "sluice-local-images"


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def test_an_incremental_local_run_embeds_only_the_changed_images(tmp_path: Path) -> None:
    photos, out, pid_file = tmp_path / "photos", tmp_path / "out", tmp_path / "pids"
    photos.mkdir()
    for i in range(6):
        (photos / f"p{i}.jpg").write_bytes(_jpeg(i))
    first = _cli(
        "local",
        "run",
        "--images",
        str(photos),
        "--shards",
        "1",
        "--json",
        "--keep",
        "--no-prometheus",
        "--out",
        str(out),
        "--pid-file",
        str(pid_file),
    )
    pids = [int(p) for p in pid_file.read_text().split()] if pid_file.exists() else []
    try:
        assert first.returncode == 0, first.stderr[-3000:]
        run1 = json.loads(first.stdout)["run_id"]
        (line,) = [x for x in first.stderr.splitlines() if x.strip().startswith("export ")]
        env = dict(kv.split("=", 1) for kv in shlex.split(line.strip())[1:])
        s3 = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_DEFAULT_REGION"],
        )
        (p0,) = [o["Key"] for o in s3.list_objects_v2(Bucket=IMAGES)["Contents"] if o["Key"].endswith("/p0.jpg")]
        prefix = p0.removesuffix("p0.jpg")
        s3.put_object(Bucket=IMAGES, Key=p0, Body=_jpeg(40))  # edited
        s3.put_object(Bucket=IMAGES, Key=prefix + "new.jpg", Body=_jpeg(41))  # added
        manifest = tmp_path / "incremental.json"
        manifest.write_text(
            json.dumps(
                {
                    "version": 1,
                    "input": {"prefix": f"s3://{IMAGES}/{prefix}", "since_run": run1},
                    "model": {"uri": "builtin:reference-cnn", "batch_size": 32, "image_size": 128},
                }
            )
        )
        second = _cli(
            "local",
            "run",
            "--manifest",
            str(manifest),
            "--demo",
            "1",
            "--json",
            "--no-prometheus",
            "--endpoint-url",
            env["AWS_ENDPOINT_URL"],
            "--out",
            str(out),
        )
        assert second.returncode == 0, second.stderr[-3000:]
        s = json.loads(second.stdout)
        assert (s["outcome"], s["processed"], s["failed"]) == ("succeeded", 2, 0), s
        assert s["lineage"] == [run1] and s["skipped"] == {"unchanged": 5}
        assert s["prepare"]["versions"]["listed"] == 7 and s["prepare"]["versions"]["earlier_rows"] == 6

        sql = _cli("output", "sql", s["run_id"], "--local", str(out), timeout=60)
        assert sql.returncode == 0, sql.stderr
        rows = duckdb.sql(sql.stdout).fetchall()
        names = [d[0] for d in duckdb.sql(sql.stdout).description]
        got = {r["key"].rsplit("/", 1)[-1]: r for r in (dict(zip(names, row, strict=True)) for row in rows)}
        assert len(rows) == len(got) == 7, "every image once"
        etags = {
            o["Key"].rsplit("/", 1)[-1]: o["ETag"].strip('"')
            for o in s3.list_objects_v2(Bucket=IMAGES, Prefix=prefix)["Contents"]
        }
        assert {k: r["etag"] for k, r in got.items()} == etags, "each row of the image's current bytes"
        assert {k for k, r in got.items() if r["run"] == s["run_id"]} == {"p0.jpg", "new.jpg"}
        # The run updated its lineage's index: every image once, the edited one's newest row.
        earlier = json.loads(first.stdout)
        assert s.get("index_uri") == earlier.get("index_uri") and s.get("index_rows") == 7, (earlier, s)
        assert s["events"][-1] == "Run Indexed"
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)


def test_since_run_uploads_over_the_earlier_input_and_skips_a_known_bad_file(tmp_path: Path) -> None:
    """The documented flow on a folder with one bad file: run 1 succeeds (1 of 21 failed); run 2,
    `--images DIR --since-run RUN1`, embeds the edited and the new image and leaves the unchanged
    bad file out (failed_before), instead of failing on it (1 of 3 would be 33% > 5%)."""
    from sluice.local.emulator.server import MotoServer

    photos, out = tmp_path / "photos", tmp_path / "out"
    photos.mkdir()
    for i in range(20):
        (photos / f"p{i}.jpg").write_bytes(_jpeg(i))
    (photos / "broken.jpg").write_text("not a jpeg\n")
    common = ("--no-prometheus", "--json", "--shards", "1", "--out", str(out))
    with MotoServer() as server:
        first = _cli("local", "run", "--images", str(photos), "--endpoint-url", server.endpoint, *common)
        assert first.returncode == 0, first.stderr[-3000:]
        s1 = json.loads(first.stdout)
        assert (s1["processed"], s1["failed"], s1["failed_by_reason"]) == (20, 1, {"not_image": 1})
        (photos / "p0.jpg").write_bytes(_jpeg(40))  # edited
        (photos / "new.jpg").write_bytes(_jpeg(41))  # added
        second = _cli(
            "local", "run", "--images", str(photos), "--since-run", s1["run_id"], "--endpoint-url", server.endpoint,
            *common,
        )  # fmt: skip
        assert second.returncode == 0, second.stderr[-3000:]
        s2 = json.loads(second.stdout)
        assert s2["input_prefix"] == s1["input_prefix"]  # uploaded over the first run's input
        assert (s2["outcome"], s2["processed"], s2["failed"]) == ("succeeded", 2, 0), s2
        assert s2["lineage"] == [s1["run_id"]] and s2["skipped"] == {"unchanged": 19, "failed_before": 1}
        sql = _cli("output", "sql", s2["run_id"], "--local", str(out), timeout=60)
        assert sql.returncode == 0, sql.stderr
        keys = [r[0].rsplit("/", 1)[-1] for r in duckdb.sql(f"SELECT key FROM ({sql.stdout})").fetchall()]
        assert sorted(keys) == sorted([f"p{i}.jpg" for i in range(20)] + ["new.jpg"])
        # At another image size no earlier vector is comparable (its model_id differs): every image again,
        # and the lineage's index, which holds the 128 px rows, refuses the 64 px ones instead of mixing them.
        third = _cli(
            "local", "run", "--images", str(photos), "--since-run", s2["run_id"], "--image-size", "64",
            "--endpoint-url", server.endpoint, *common,
        )  # fmt: skip
        assert third.returncode == 0, third.stderr[-3000:]
        s3 = json.loads(third.stdout)
        assert (s3["outcome"], s3["processed"], s3["skipped"]) == ("succeeded", 21, {"unchanged": 0}), s3
        assert "image_size=64" in s3["index_error"] and "image_size=128" in s3["index_error"], s3
