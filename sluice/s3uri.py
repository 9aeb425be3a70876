"""s3:// URI parsing and S3 key/bucket validation."""

from __future__ import annotations

import re

MAX_KEY_BYTES = 1024
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


def is_bucket_name(name: str) -> bool:
    """True for a syntactically valid S3 bucket name."""
    return bool(_BUCKET.match(name)) and ".." not in name


def parse_s3_uri(uri: str, *, allow_empty_key: bool = False) -> tuple[str, str]:
    """'s3://bucket/key' -> (bucket, key); ValueError says what is wrong."""
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri[:80]!r} is not an s3:// URI")
    bucket, _sep, key = uri[5:].partition("/")
    if not is_bucket_name(bucket):
        raise ValueError(f"{uri[:80]!r}: {bucket[:70]!r} is not a valid bucket name")
    if not allow_empty_key and not key:
        raise ValueError(f"{uri[:80]!r} names a bucket but no object key")
    return bucket, key


def key_problem(key: str) -> str | None:
    """Why `key` cannot be an S3 object key, or None when it can."""
    if not key:
        return "empty key"
    n = len(key.encode("utf-8", "surrogatepass"))
    if n > MAX_KEY_BYTES:
        return f"key is {n} bytes; S3 keys are at most {MAX_KEY_BYTES}"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "key is not valid UTF-8"
    return None
