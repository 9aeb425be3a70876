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
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)
