"""Every key a manifest names, from whichever source it names, filtered and validated."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts.manifest import Manifest
from sluice.errors import Rejection
from sluice.input.inventory import iter_inventory
from sluice.input.sources import (
    KEYLIST_SUFFIXES,
    KeyBatch,
    Problems,
    get_chunks,
    inline_keys,
    iter_keylist,
    iter_prefix,
)
from sluice.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def iter_keys(
    manifest: Manifest, s3: S3Client | None, settings: Settings, problems: Problems | None = None
) -> Iterator[KeyBatch]:
    """All keys the manifest names, as validated batches; raises Rejection at the end if any problem.

    `s3` reads a key list, a prefix or an inventory; inline keys (input.keys) need none.
    """
    problems = problems or Problems()
    spec = manifest.input
    default_bucket = spec.bucket or settings.default_input_bucket
    suffixes = tuple(s.lower() for s in spec.suffixes) if spec.suffixes else None
    source: Iterator[KeyBatch]
    if spec.keys is not None:
        source = inline_keys(spec.keys, default_bucket, problems)
    elif spec.key_list is not None:
        try:
            b, k = parse_s3_uri(spec.key_list)
        except ValueError as exc:
            raise Rejection(f"input.key_list: {exc}") from exc
        kind = next((s for s in KEYLIST_SUFFIXES if k.lower().endswith(s)), ".txt")
        source = iter_keylist(
            get_chunks(_client(s3), b, k, settings.max_keylist_bytes), spec.key_list, kind, default_bucket, problems
        )
    elif spec.prefix is not None:
        try:
            parse_s3_uri(spec.prefix, allow_empty_key=True)
        except ValueError as exc:
            raise Rejection(f"input.prefix: {exc}") from exc
        source = iter_prefix(_client(s3), spec.prefix, suffixes)
        suffixes = None
    else:
        assert spec.inventory is not None
        try:
            parse_s3_uri(spec.inventory)
        except ValueError as exc:
            raise Rejection(f"input.inventory: {exc}") from exc
        source = iter_inventory(_client(s3), spec.inventory, settings, problems)
    allowed = set(settings.allowed_buckets)
    for bucket, keys in source:
        if allowed and bucket not in allowed:
            problems.add(
                f"s3://{bucket}/{keys[0][:80]}: bucket {bucket!r} is not allowed "
                f"(SLUICE_ALLOWED_BUCKETS: {', '.join(sorted(allowed))})"
            )
            continue
        if suffixes:
            keys = [k for k in keys if k.lower().endswith(suffixes)]
        if keys:
            yield bucket, keys
    problems.raise_if_any()


def _client(s3: S3Client | None) -> S3Client:
    if s3 is None:
        raise ValueError("iter_keys: this manifest's input is read from S3, and no S3 client was given")
    return s3
