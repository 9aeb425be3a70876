"""AWS Batch "Batch Job State Change" -> run ledger -> run progress and outcome events."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from sluice.batch_events import BatchJobStateChangeEvent
from sluice.completion import handle_job_event
from sluice.log import logger


@logger.inject_lambda_context(log_event=False)
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        parsed = parse(event=event, model=BatchJobStateChangeEvent)
    except (ValidationError, TypeError) as exc:  # a bad event is logged and dropped, never retried in a loop
        logger.warning("ignoring malformed Batch event", extra={"error": str(exc)[:2000]})
        return {"status": "ignored", "reason": "malformed event"}
    return handle_job_event(parsed.detail).as_dict()
