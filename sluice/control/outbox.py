"""Publish what the RUN item's outbox holds, then clear it: announcements are never lost.

A transition writes its event into the outbox in the same update (sluice.control.ledger), so a
crash or a failed PutEvents between the two leaves the event there: the redelivered event,
or the reconciliation sweep, publishes it. Delivery is at least once; subscribers
deduplicate by (detail-type, run_id), as they must for EventBridge anyway; concurrent
invocations do not both publish (the first to claim the outbox does).
"""

from __future__ import annotations

import json

from sluice.contracts import RunItem, parse_detail
from sluice.control.ledger import Ledger
from sluice.control.notify import EventPublisher
from sluice.log import logger


def deliver(ledger: Ledger, events: EventPublisher, run: RunItem | None) -> str | None:
    """Publish the run's pending event, if any; returns its detail-type."""
    if run is None or run.outbox is None or not ledger.claim_outbox(run.run_id, run.outbox.detail_type):
        return None
    detail = parse_detail(run.outbox.detail_type, json.loads(run.outbox.detail))
    try:
        events.publish(detail)
    except Exception:
        ledger.release_outbox(run.run_id, detail.detail_type)  # the next delivery or sweep tries again
        raise
    ledger.clear_outbox(run.run_id, detail.detail_type)
    logger.info("event published", extra={"run_id": run.run_id, "detail_type": detail.detail_type})
    return detail.detail_type
