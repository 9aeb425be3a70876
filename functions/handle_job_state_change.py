"""AWS Batch "Batch Job State Change" -> runs table -> run progress and outcome events.

The same function runs the reconciliation sweep on its 5-minute schedule ("Scheduled Event").
"""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from sluice.control.completion.batch_events import BatchJobStateChangeEvent
from sluice.control.completion.state_change import handle_job_event
from sluice.control.sweep.reconcile import reconcile
from sluice.log import logger

SCHEDULED = "Scheduled Event"


@logger.inject_lambda_context(log_event=False)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    if event.get("source") == "aws.events" and event.get("detail-type") == SCHEDULED:
        done = [r.as_dict() for r in reconcile() if r.actions]
        logger.info("reconciliation sweep", extra={"runs_changed": len(done)})
        return {"status": "reconciled", "runs": done}
    try:
        parsed = parse(event=event, model=BatchJobStateChangeEvent)
    except (ValidationError, TypeError) as exc:  # a bad event is logged and dropped, never retried in a loop
        logger.warning("ignoring malformed Batch event", extra={"error": str(exc)[:2000]})
        return {"status": "ignored", "reason": "malformed event"}
    return handle_job_event(parsed.detail).as_dict()
