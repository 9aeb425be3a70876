"""Real-shaped EventBridge events for the local router (same shape AWS delivers)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sluice.infra import ACCOUNT


def s3_object_created(
    bucket: str, key: str, *, size: int, etag: str, version_id: str | None, sequencer: str, region: str = "us-east-1"
) -> dict[str, Any]:
    """An S3 "Object Created" event as EventBridge delivers it to a rule target."""
    obj: dict[str, Any] = {"key": key, "size": size, "etag": etag.strip('"'), "sequencer": sequencer}
    if version_id:
        obj["version-id"] = version_id
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Object Created",
        "source": "aws.s3",
        "account": ACCOUNT,
        "time": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": region,
        "resources": [f"arn:aws:s3:::{bucket}"],
        "detail": {
            "version": "0",
            "bucket": {"name": bucket},
            "object": obj,
            "request-id": uuid.uuid4().hex[:16].upper(),
            "requester": ACCOUNT,
            "source-ip-address": "127.0.0.1",
            "reason": "PutObject",
        },
    }


def matches(pattern: dict[str, Any], event: dict[str, Any]) -> bool:
    """EventBridge pattern matching for the subset Sluice's rules use (values, prefix)."""
    for field, want in pattern.items():
        have = event.get(field)
        if isinstance(want, dict):
            if not isinstance(have, dict) or not matches(want, have):
                return False
            continue
        if not any(_match_one(w, have) for w in want):
            return False
    return True


def _match_one(want: Any, have: Any) -> bool:
    if isinstance(want, dict):
        if "prefix" in want:
            return isinstance(have, str) and have.startswith(want["prefix"])
        if "anything-but" in want:
            bad = want["anything-but"]
            return have not in (bad if isinstance(bad, list) else [bad])
        if "exists" in want:
            return (have is not None) == bool(want["exists"])
        return False
    return bool(want == have)
