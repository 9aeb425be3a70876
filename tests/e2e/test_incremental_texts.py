"""An incremental text run: a long report edited down to one chunk is redone whole, the unchanged texts skipped.

Run 1 embeds a folder of texts (a report of several chunks). The report is then cut to a line
and a text added; run 2 names run 1 in since_run. `sluice output sql RUN2` returns every text
whole from the run that embedded its current bytes: the report's one new chunk and none of
its old ones.
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

from tests.e2e.test_local_run import _alive

CLI = [sys.executable, "-m", "sluice.cli"]
BUCKET = "sluice-local-images"
REPORT = " ".join(f"finding {i} of the audit is noted." for i in range(200))  # 1,200 words: several chunks


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


def _s3(stderr: str):
    (line,) = [x for x in stderr.splitlines() if x.strip().startswith("export ")]
    env = dict(kv.split("=", 1) for kv in shlex.split(line.strip())[1:])
    client = boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    return client, env["AWS_ENDPOINT_URL"]


def test_an_edited_text_is_redone_whole_and_unchanged_ones_skipped(tmp_path: Path) -> None:
    docs, out, pid_file = tmp_path / "docs", tmp_path / "out", tmp_path / "pids"
    docs.mkdir()
    (docs / "report.txt").write_text(REPORT)
    (docs / "a.md").write_text("# A\n\nshort note")
    (docs / "b.txt").write_text("another short note")
    flags = ["--json", "--no-prometheus", "--out", str(out)]
    first = _cli("local", "run", "--texts", str(docs), "--shards", "1", "--keep", "--pid-file", str(pid_file), *flags)
    pids = [int(p) for p in pid_file.read_text().split()] if pid_file.exists() else []
    try:
        assert first.returncode == 0, first.stderr[-3000:]
        run1 = json.loads(first.stdout)["run_id"]
        s3, endpoint = _s3(first.stderr)
        (report,) = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"] if o["Key"].endswith("report.txt")]
        prefix = report.removesuffix("report.txt")
        s3.put_object(Bucket=BUCKET, Key=report, Body=b"The audit found nothing.")  # edited down to one chunk
        s3.put_object(Bucket=BUCKET, Key=prefix + "c.txt", Body=b"a new note")
        manifest = tmp_path / "incremental.json"
        inp = {"prefix": f"s3://{BUCKET}/{prefix}", "kind": "text", "since_run": run1}
        manifest.write_text(json.dumps({"version": 1, "input": inp}))
        second = _cli("local", "run", "--manifest", str(manifest), "--endpoint-url", endpoint, *flags)
        assert second.returncode == 0, second.stderr[-3000:]
        s = json.loads(second.stdout)
        assert (s["outcome"], s["processed"], s["skipped"]) == ("succeeded", 2, {"unchanged": 2}), s

        sql = _cli("output", "sql", s["run_id"], "--local", str(out), timeout=60)
        assert sql.returncode == 0, sql.stderr
        rel = duckdb.sql(sql.stdout)
        names = [d[0] for d in rel.description]
        rows = [dict(zip(names, r, strict=True)) for r in rel.fetchall()]
        by_key: dict[str, list[dict]] = {}
        for r in rows:
            by_key.setdefault(r["key"].rsplit("/", 1)[-1], []).append(r)
        assert {k: len(v) for k, v in by_key.items()} == {"report.txt": 1, "a.md": 1, "b.txt": 1, "c.txt": 1}
        assert {k for k, v in by_key.items() if v[0]["run"] == s["run_id"]} == {"report.txt", "c.txt"}
        (r,) = by_key["report.txt"]
        assert (r["part"], r["part_start"], r["part_end"]) == (0, 0.0, len("The audit found nothing."))
        old = [
            p
            for f in (out / run1 / "output").rglob("*.parquet")
            for p in duckdb.sql(f"SELECT part FROM '{f}' WHERE key LIKE '%report.txt'").fetchall()
        ]
        assert len(old) >= 3, "run 1 held the report in several chunks"
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)
