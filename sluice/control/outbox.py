"""Publish what the RUN item's outbox holds, then clear it: announcements are never lost.

A transition writes its event into the outbox in the same update (sluice.control.table.ledger), so a
crash or a failed PutEvents between the two leaves the event there: the redelivered event,
or the reconciliation sweep, publishes it. Delivery is at least once; subscribers
deduplicate by (detail-type, run_id), as they must for EventBridge anyway; concurrent
invocations do not both publish (the first to claim the outbox does), and the claim returns
the event the item holds then, so a stale view of the item never publishes a replaced event.
Each invocation path publishes in one step: the manifest handler at its end
(sluice.control.intake.coordinator), Batch events and the sweep where they decide
(sluice.control.completion.state_change.decide).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from sluice.contracts.events import parse_detail
from sluice.log import logger

if TYPE_CHECKING:
    from sluice.control.context import Context


def deliver(ctx: Context, run_id: str) -> str | None:
    """Publish the run's pending event, if any; returns its detail-type."""
    held = ctx.ledger.claim_outbox(run_id)
    if held is None:
        return None
    detail = parse_detail(held.detail_type, json.loads(held.detail))
    try:
        ctx.events.publish(detail)
    except Exception:
        ctx.ledger.release_outbox(run_id, detail.detail_type)  # the next delivery or sweep tries again
        raise
    ctx.ledger.clear_outbox(run_id, detail.detail_type)
    logger.info("event published", extra={"run_id": run_id, "detail_type": detail.detail_type})
    return detail.detail_type
