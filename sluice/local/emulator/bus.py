"""One local run's view of Sluice's buses: a queue and rules of its own, read for its run id only.

An emulator kept running serves several runs, one after another or at once. A queue shared by
them would give each summary whatever any run published (an interrupted run's events, a
concurrent run's "Run Submitted"), and reading it would take those events from the run they
belong to. So each run opens its own tap before it uploads its manifest (its "Run Submitted"
is published while the manifest is planned, before its run id is known), keeps only the
events of its run id, and removes the rules and the queue when it ends.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from sluice.local.emulator.template import ACCOUNT

SOURCE_PATTERN = json.dumps({"source": ["sluice"]})


@dataclass(frozen=True)
class BusTap:
    """This run's SQS queue and the rules that copy every Sluice event on the stack's buses into it."""

    queue_url: str
    rules: tuple[tuple[str, str], ...]  # (rule name, bus name)

    @classmethod
    def open(cls, c: Any, stack: Any) -> BusTap:
        """A new queue and one rule a bus (names unique to this run: runs on one emulator do not share them)."""
        token = uuid.uuid4().hex[:12]
        name = f"{stack.stack_name}-tap-{token}"
        url = c.sqs.create_queue(QueueName=name)["QueueUrl"]
        rules: list[tuple[str, str]] = []
        for bus in stack.buses:
            rule = f"{name}-{len(rules)}"
            c.events.put_rule(Name=rule, EventBusName=bus, EventPattern=SOURCE_PATTERN)
            c.events.put_targets(
                Rule=rule,
                EventBusName=bus,
                Targets=[{"Id": "tap", "Arn": f"arn:aws:sqs:{stack.region}:{ACCOUNT}:{name}"}],
            )
            rules.append((rule, bus))
        return cls(url, tuple(rules))

    def events(self, c: Any, run_id: str) -> list[dict[str, Any]]:
        """The events of `run_id` published since the tap opened, in the order read; other runs' are dropped."""
        out: list[dict[str, Any]] = []
        while True:
            msgs = c.sqs.receive_message(QueueUrl=self.queue_url, MaxNumberOfMessages=10).get("Messages", [])
            if not msgs:
                return out
            for m in msgs:
                event = json.loads(m["Body"])
                if (event.get("detail") or {}).get("run_id") == run_id:
                    out.append(event)
                c.sqs.delete_message(QueueUrl=self.queue_url, ReceiptHandle=m["ReceiptHandle"])

    def close(self, c: Any) -> None:
        """Remove the rules and the queue (best effort: the emulator may already be gone)."""
        for rule, bus in self.rules:
            with contextlib.suppress(Exception):
                c.events.remove_targets(Rule=rule, EventBusName=bus, Ids=["tap"])
            with contextlib.suppress(Exception):
                c.events.delete_rule(Name=rule, EventBusName=bus)
        with contextlib.suppress(Exception):
            c.sqs.delete_queue(QueueUrl=self.queue_url)
