"""Each local run reads its own events from an emulator that several runs share (sluice.local.emulator.bus)."""

from __future__ import annotations

from sluice.contracts.events import RunProgress, RunSubmitted
from sluice.control.notify import EventPublisher
from sluice.local.emulator.bus import BusTap


def _submitted(run_id: str) -> RunSubmitted:
    return RunSubmitted(
        run_id=run_id,
        manifest="s3://c/manifests/m.json",
        total_keys=3,
        duplicates=0,
        shards=1,
        mode="array",
        job_ids=["j"],
        plan_uri=f"s3://c/runs/{run_id}/plan.json",
    )


def _progress(run_id: str) -> RunProgress:
    return RunProgress(run_id=run_id, shards_done=1, shards_failed=0, shards_total=1)


def test_two_runs_at_once_each_read_only_their_own_events_and_lose_none(aws, stack):
    bus = EventPublisher(aws.events, stack.buses[0])
    interrupted = "local-run-old"
    bus.publish(_submitted(interrupted))  # an earlier run's events, before either tap opened
    bus.publish(_progress(interrupted))
    a, b = BusTap.open(aws, stack), BusTap.open(aws, stack)
    bus.publish(_submitted("local-run-a"))
    bus.publish(_submitted("local-run-b"))
    bus.publish(_progress(interrupted))  # e.g. `sluice reconcile` concluding the interrupted run
    bus.publish(_progress("local-run-a"))

    first_b = b.events(aws, "local-run-b")  # B reads first: A's events must still reach A
    assert [e["detail-type"] for e in first_b] == ["Run Submitted"]
    got_a = a.events(aws, "local-run-a")
    assert [(e["detail-type"], e["detail"]["run_id"]) for e in got_a] == [
        ("Run Submitted", "local-run-a"),
        ("Run Progress", "local-run-a"),
    ]
    assert a.events(aws, "local-run-a") == []  # read once


def test_a_closed_tap_leaves_no_queue_or_rule_behind(aws, stack):
    before = set(aws.sqs.list_queues().get("QueueUrls", []))
    tap = BusTap.open(aws, stack)
    rules = {r["Name"] for r in aws.events.list_rules(EventBusName=stack.buses[0])["Rules"]}
    assert {name for name, _ in tap.rules} <= rules
    tap.close(aws)
    assert set(aws.sqs.list_queues().get("QueueUrls", [])) == before
    left = {r["Name"] for r in aws.events.list_rules(EventBusName=stack.buses[0])["Rules"]}
    assert not {name for name, _ in tap.rules} & left
