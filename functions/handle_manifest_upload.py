"""S3 "Object Created" (via EventBridge) under manifests/ -> plan, shard, submit."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.parser import event_parser
from aws_lambda_powertools.utilities.parser.models import S3EventNotificationEventBridgeModel
from aws_lambda_powertools.utilities.typing import LambdaContext

from sluice.control.intake.coordinator import handle_upload
from sluice.control.table.items import UploadItem
from sluice.log import logger


@logger.inject_lambda_context(log_event=False)
@event_parser(model=S3EventNotificationEventBridgeModel)
def handler(event: S3EventNotificationEventBridgeModel, context: LambdaContext) -> dict[str, Any]:
    obj = event.detail.object
    upload = UploadItem(
        bucket=event.detail.bucket.name, key=obj.key, version_id=obj.version_id, etag=obj.etag, sequencer=obj.sequencer
    )
    return handle_upload(upload).as_dict()
