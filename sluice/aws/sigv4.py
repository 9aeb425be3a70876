"""SigV4 signing for Amazon Managed Service for Prometheus (service `aps`), over the exact bytes sent."""

from __future__ import annotations

import re
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

# Regional, FIPS, China and interface VPC endpoint (vpce-...) host names, optionally with :443.
AMP_HOST = re.compile(
    r"^https://(?:vpce-[a-z0-9-]+\.)?aps-workspaces(?:-fips)?\.([a-z0-9-]+)\.(?:vpce\.)?"
    r"amazonaws\.com(?:\.cn)?(?::443)?(?:/|$)"
)
_lock = threading.Lock()
_credentials: Any = None


def region_of(url: str) -> str | None:
    """The AWS region of an AMP workspace URL, or None for any other endpoint."""
    m = AMP_HOST.match(url)
    return m.group(1) if m else None


def normalize(url: str) -> str:
    """`url` without a default port, so the Host header sent and the one signed agree."""
    parts = urllib.parse.urlsplit(url)
    if (parts.scheme, parts.port) in (("https", 443), ("http", 80)):
        parts = parts._replace(netloc=parts.netloc.rsplit(":", 1)[0])
    return urllib.parse.urlunsplit(parts)


def encode_query(params: Mapping[str, str]) -> str:
    """RFC 3986 percent-encoding, as SigV4's canonical query wants (a space is %20, never '+')."""
    q = urllib.parse.quote
    return "&".join(f"{q(k, safe='-_.~')}={q(v, safe='-_.~')}" for k, v in sorted(params.items()))


def credentials() -> Any:
    """The default credential chain's credentials, resolved once per process (they refresh themselves)."""
    global _credentials
    with _lock:
        if _credentials is None:
            import botocore.session

            _credentials = botocore.session.get_session().get_credentials()
        if _credentials is None:
            raise RuntimeError("no AWS credentials to sign the request for AMP (job role or profile missing?)")
        return _credentials


def sign_aps(method: str, url: str, body: bytes | None, headers: Mapping[str, str], region: str) -> dict[str, str]:
    """`headers` plus a SigV4 signature for `aps` over exactly `method url body headers`.

    `url` must already be in its final, encoded form (`encode_query`): botocore signs its query
    string as given, so what is signed is what is sent.
    """
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest

    req = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    SigV4Auth(credentials().get_frozen_credentials(), "aps", region).add_auth(req)
    return dict(req.headers.items())
