"""`sluice status` / `sluice runs` against the ledger on moto."""

from __future__ import annotations

import io
import json

from sluice.control.table.ledger import Ledger
from sluice.ops.status import cmd_runs, cmd_status
from tests.integration.completion_support import deliver_job_event, job_event, submit_run, write_result


def test_status_shows_progress_and_runs_lists_newest_first(aws, stack, monkeypatch):
    first = submit_run(aws, stack, monkeypatch, n_keys=30, keys_per_shard=10, name="older")
    second = submit_run(aws, stack, monkeypatch, n_keys=30, keys_per_shard=10, name="newer")
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    ledger.call(
        "update_item",
        Key={"pk": {"S": second["run_id"]}, "sk": {"S": "RUN"}},
        UpdateExpression="SET created_at = created_at + :d",
        ExpressionAttributeValues={":d": {"N": "5"}},
    )
    run_id, job_id = second["run_id"], second["job_ids"][0]
    write_result(aws, stack, run_id, 0, processed=9, failures=[("s3://images-in/img/00001.jpg", "corrupt")])
    deliver_job_event(
        stack,
        job_event(
            "batch-array-child-succeeded", run_id=run_id, job_id=job_id, queue=stack.names["GpuJobQueue"], child=0
        ),
        monkeypatch,
    )

    buf = io.StringIO()
    assert cmd_status(ledger, run_id, watch=False, as_json=True, out=buf) == 0
    s = json.loads(buf.getvalue())
    assert (s["status"], s["shards_done"], s["shards_total"], s["keys_processed"], s["keys_failed"]) == (
        "SUBMITTED",
        1,
        3,
        9,
        1,
    )
    buf = io.StringIO()
    cmd_status(ledger, run_id, watch=False, as_json=False, out=buf)
    assert "[##########....................] 1/3" in buf.getvalue()
    assert "[##########....................] 10/30  (1 failed)" in buf.getvalue()

    buf = io.StringIO()
    assert cmd_runs(ledger, limit=10, as_json=True, out=buf) == 0
    assert [r["run_id"] for r in json.loads(buf.getvalue())] == [run_id, first["run_id"]]


def test_status_of_an_unknown_run_is_an_error(aws, stack, capsys):
    assert cmd_status(Ledger(aws.dynamodb, stack.names["RunsTable"]), "nope", watch=False, as_json=False) == 1
    assert "no run 'nope'" in capsys.readouterr().err


def test_status_of_an_audio_run_counts_its_windows_and_seconds_once_whatever_the_event_order(aws, stack, monkeypatch):
    run = submit_run(aws, stack, monkeypatch, n_keys=30, keys_per_shard=10, name="audio")
    run_id, job_id = run["run_id"], run["job_ids"][0]
    ledger = Ledger(aws.dynamodb, stack.names["RunsTable"])
    ledger.call(
        "update_item",
        Key={"pk": {"S": run_id}, "sk": {"S": "RUN"}},
        UpdateExpression="SET kind = :k",
        ExpressionAttributeValues={":k": {"S": "audio"}},
    )
    write_result(aws, stack, run_id, 0, processed=10, parts=37, media_s=352.25)
    write_result(aws, stack, run_id, 2, processed=10, parts=12, media_s=101.5)
    queue = stack.names["GpuJobQueue"]
    events = [
        job_event("batch-array-child-succeeded", run_id=run_id, job_id=job_id, queue=queue, child=c) for c in (2, 0, 2)
    ]  # shard 2 delivered twice
    for event in events:
        deliver_job_event(stack, event, monkeypatch)
    buf = io.StringIO()
    cmd_status(ledger, run_id, watch=False, as_json=True, out=buf)
    s = json.loads(buf.getvalue())
    assert (s["keys_processed"], s["parts"], s["media_s"]) == (20, 49, 453.75)
    buf = io.StringIO()
    cmd_status(ledger, run_id, watch=False, as_json=False, out=buf)
    assert "audio files [####################..........] 20/30  (0 failed; 49 windows, 453.8 s of audio)" in (
        buf.getvalue()
    )
