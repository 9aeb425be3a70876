"""s3:// URIs (parsing and building) and S3 key/bucket validation."""

from __future__ import annotations

import functools
import re

MAX_KEY_BYTES = 1024
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")
_IP = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
# Reserved by S3 (General purpose bucket naming rules): access point aliases, Object Lambda,
# Multi-Region Access Points, directory and table buckets, documentation examples.
_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")
# C0 controls, DEL and lone UTF-16 surrogates: S3 may store the first two, but a key list that
# holds them is almost always damaged (a NUL from a binary file, a tab from a pasted table), and
# a surrogate is no character at all. \r at a line's end is removed before this check.
_BAD_CHAR = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


@functools.lru_cache(maxsize=4096)  # called for every key-list line; a run names few buckets
def is_bucket_name(name: str) -> bool:
    """True for a valid S3 general purpose bucket name (3-63 of a-z 0-9 . -, S3's other rules)."""
    return (
        bool(_BUCKET.match(name))
        and ".." not in name
        and not _IP.match(name)
        and not name.startswith(_RESERVED_PREFIXES)
        and not name.endswith(_RESERVED_SUFFIXES)
    )


def bucket_problem(name: str) -> str | None:
    """Why `name` is not a valid bucket name (S3's naming rules), or None."""
    if is_bucket_name(name):
        return None
    shown = repr(name[:70])
    if not 3 <= len(name) <= 63:
        return f"{shown} is not a valid bucket name: S3 bucket names are 3 to 63 characters"
    if not _BUCKET.match(name):
        return (
            f"{shown} is not a valid bucket name: use lowercase letters, digits, '.' and '-', "
            "starting and ending with a letter or digit"
        )
    if ".." in name:
        return f"{shown} is not a valid bucket name: two adjacent periods"
    if _IP.match(name):
        return f"{shown} is not a valid bucket name: it is formatted as an IP address"
    return f"{shown} is not a valid bucket name: the prefix or suffix is reserved by S3"


def parse_s3_uri(uri: str, *, allow_empty_key: bool = False) -> tuple[str, str]:
    """'s3://bucket/key' -> (bucket, key); ValueError says what is wrong."""
    if not uri.startswith("s3://"):
        raise ValueError(f"{uri[:80]!r} is not an s3:// URI")
    bucket, _sep, key = uri[5:].partition("/")
    if not is_bucket_name(bucket):
        # The short form: key-list reasons (and the prepare stage's tests) carry it as is.
        raise ValueError(f"{uri[:80]!r}: {bucket[:70]!r} is not a valid bucket name")
    if not allow_empty_key and not key:
        raise ValueError(f"{uri[:80]!r} names a bucket but no object key")
    return bucket, key


def s3_uri(bucket: str, key: str) -> str:
    """(bucket, key) -> 's3://bucket/key': parse_s3_uri's inverse (a prefix for a key gives the prefix's URI)."""
    return f"s3://{bucket}/{key}"


def bad_char(key: str) -> str | None:
    """Why `key` holds a character a key list must not (a control character or a lone surrogate), or None."""
    if key.isprintable():  # the common case, in C: no control character, no surrogate
        return None
    m = _BAD_CHAR.search(key)
    if m is None:
        return None
    c = m.group()
    kind = "a lone UTF-16 surrogate" if "\ud800" <= c <= "\udfff" else "a control character"
    return f"{kind} U+{ord(c):04X} at character {m.start() + 1}: remove it (is the file binary or damaged?)"


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
