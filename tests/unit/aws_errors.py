"""Real botocore ClientErrors, as an AWS response with this code and status would raise them."""

from __future__ import annotations

from botocore.exceptions import ClientError


def client_error(code: str, status: int, message: str = "", op: str = "Op") -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}, op
    )
