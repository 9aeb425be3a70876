"""SigV4 signing for Amazon Managed Service for Prometheus (service `aps`)."""

from __future__ import annotations

import re

AMP_HOST = re.compile(r"^https://aps-workspaces\.([a-z0-9-]+)\.amazonaws\.com(\.cn)?/")


def region_of(url: str) -> str | None:
    """The AWS region of an AMP workspace URL, or None for any other endpoint."""
    m = AMP_HOST.match(url)
    return m.group(1) if m else None


def sign_aps(method: str, url: str, body: bytes | None, headers: dict[str, str], region: str) -> dict[str, str]:
    """Headers plus a SigV4 signature for `aps` with the default credential chain."""
    import boto3
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    creds = boto3.session.Session().get_credentials()
    if creds is None:
        raise RuntimeError("no AWS credentials to sign the request for AMP (job role or profile missing?)")
    req = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    SigV4Auth(creds.get_frozen_credentials(), "aps", region).add_auth(req)
    return dict(req.headers.items())
