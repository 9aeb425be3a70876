"""S3 Inventory reports: manifest.json verified and parsed, its data files read as keys.

The manifest Lambda (sluice.input.keys.iter_keys) and the prepare stage read manifest.json with
these functions; a data file's rows are sluice.input.inventory_files'. A report that is damaged,
of another format or without Bucket and Key columns is a Rejection that names manifest.json.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import BotoCoreError, ClientError

from sluice.aws.errors import Kind, classify
from sluice.aws.s3uri import bad_char, bucket_problem, parse_s3_uri, s3_uri
from sluice.errors import Rejection
from sluice.input import strictjson
from sluice.input.inventory_files import csv_keys, parquet_keys
from sluice.input.sources import KeyBatch, Problems, get_chunks, s3_error
from sluice.log import logger
from sluice.paths import MANIFESTS_PREFIX
from sluice.settings import Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

CHECKSUM_SUFFIX = ".checksum"


def checksum_uri(uri: str) -> str:
    """Where S3 Inventory writes the MD5 of `uri` (manifest.json -> manifest.checksum)."""
    return uri.removesuffix(".json") + CHECKSUM_SUFFIX


def verify_checksum(s3: S3Client, uri: str, raw: bytes) -> None:
    """manifest.checksum must hold the MD5 of manifest.json's bytes.

    Required next to a report S3 Inventory delivered; a manifest.json copied under manifests/ by
    hand is checked only when its .checksum was copied too (it may arrive after the manifest).
    """
    bucket, key = parse_s3_uri(uri)
    where = checksum_uri(uri)
    ck = checksum_uri(key)
    try:
        resp = s3.get_object(Bucket=bucket, Key=ck)
        text = bytes(resp["Body"].read(1024))
    except (ClientError, BotoCoreError, OSError) as exc:
        kind = classify(exc).kind
        if kind is Kind.DENIED:
            # template.yaml grants the manifest role *.checksum in the input buckets; a report in a
            # bucket it was not deployed with may still deny it, and a check the role cannot make
            # must not reject a report it can read.
            logger.warning("inventory checksum not verified: access denied", extra={"checksum": where})
            return
        if kind is Kind.NOT_FOUND:
            if key.startswith(MANIFESTS_PREFIX):
                return
            raise Rejection(
                f"{where} does not exist: S3 Inventory writes it next to manifest.json; name the report's own "
                "manifest.json, or copy its manifest.checksum too"
            ) from exc
        raise s3_error(exc, where) from exc
    want = text.decode("ascii", "replace").strip().lower()
    got = hashlib.md5(raw, usedforsecurity=False).hexdigest()
    if want != got:
        raise Rejection(
            f"{uri}: MD5 {got} does not match {where} ({want[:40]!r}): the manifest is damaged or was changed "
            "after delivery; use an intact report"
        )


def read_report(s3: S3Client, uri: str, settings: Settings) -> InventoryReport:
    """manifest.json (bounded), its checksum verified, parsed and checked (format, schema, files)."""
    bucket, key = parse_s3_uri(uri)
    raw = b"".join(get_chunks(s3, bucket, key, settings.max_manifest_bytes, "SLUICE_MAX_MANIFEST_BYTES"))
    report = read_inventory_manifest(raw, uri)  # first: a file that is no report is told so
    verify_checksum(s3, uri, raw)
    return report


def iter_inventory(s3: S3Client, uri: str, settings: Settings, problems: Problems) -> Iterator[KeyBatch]:
    """Every key of the report's data files, in order."""
    return iter_report(s3, read_report(s3, uri, settings), settings, problems)


def iter_report(s3: S3Client, report: InventoryReport, settings: Settings, problems: Problems) -> Iterator[KeyBatch]:
    """Every key of a parsed report's data files (in its destination bucket), in order."""
    for i, data_key in enumerate(report.files):
        name = s3_uri(report.bucket, data_key)
        chunks = get_chunks(s3, report.bucket, data_key, settings.max_keylist_bytes)
        md5 = report.md5s[i] if i < len(report.md5s) else None
        if md5 is not None:
            chunks = _checked(chunks, md5, name)
        if report.format == "CSV":
            yield from csv_keys(
                chunks, report.columns, name, problems, settings.max_inflated_bytes, settings.max_inflate_ratio
            )
        else:  # Parquet needs random access: spooled to local disk, read a row group at a time
            with tempfile.NamedTemporaryFile(prefix="sluice-inv-", suffix=".parquet", dir=settings.spill_dir) as fh:
                for chunk in chunks:
                    fh.write(chunk)
                fh.flush()
                yield from parquet_keys(
                    fh.name, name, problems, settings.max_inflated_bytes, settings.max_inflate_ratio
                )


def _checked(chunks: Iterable[bytes], want: str, name: str) -> Iterator[bytes]:
    """The chunks, then a rejection if their MD5 is not the report's files[].MD5checksum.

    The check comes at the file's end, within pass 1 of the scan: nothing is written before
    every key was read, so a damaged file still rejects the whole run.
    """
    h = hashlib.md5(usedforsecurity=False)
    for chunk in chunks:
        h.update(chunk)
        yield chunk
    if h.hexdigest() != want:
        raise Rejection(
            f"inventory file {name}: MD5 {h.hexdigest()} does not match the report's MD5checksum {want}: the file "
            "is damaged or was changed after delivery; use an intact report"
        )


@dataclass(frozen=True)
class InventoryReport:
    """An S3 Inventory manifest.json: where its data files are, their keys and sizes (None: not listed)."""

    uri: str
    bucket: str
    format: Literal["CSV", "PARQUET"]
    columns: list[str]
    files: list[str]
    sizes: list[int | None] = field(default_factory=list)
    md5s: list[str | None] = field(default_factory=list)  # files[].MD5checksum: the data file's MD5, hex


def read_inventory_manifest(raw: bytes, uri: str) -> InventoryReport:
    """Parse and check manifest.json: the one reader of it (the manifest Lambda's and the prepare stage's)."""
    bucket, _ = parse_s3_uri(uri) if uri.startswith("s3://") else ("local", uri)
    inv = strictjson.loads(raw, uri)
    try:
        fmt = str(inv["fileFormat"]).upper()
        entries = inv["files"]
        if not isinstance(entries, list) or not all(isinstance(f, dict) for f in entries):
            raise TypeError("files must be a list of objects")
        files = [f["key"] for f in entries]
        if not all(isinstance(k, str) and k and not bad_char(k) for k in files):
            raise TypeError("every files[].key must be an object key")
        sizes = [_size(f.get("size")) for f in entries]
        md5s = [_md5(f.get("MD5checksum")) for f in entries]
        dest = str(inv.get("destinationBucket", f"arn:aws:s3:::{bucket}")).rsplit(":", 1)[-1]
        schema = [c.strip() for c in str(inv.get("fileSchema", "Bucket, Key")).split(",")]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Rejection(f"{uri}: not an S3 Inventory manifest.json ({exc!r} missing or malformed)") from exc
    if fmt not in ("CSV", "PARQUET"):
        raise Rejection(f"{uri}: inventory format {fmt[:40]} is not supported; use CSV or Parquet")
    if not files:
        raise Rejection(f"{uri}: inventory lists no data files")
    why = bucket_problem(dest)
    if why:
        raise Rejection(f"{uri}: destinationBucket: {why}")
    if fmt == "CSV" and not {"bucket", "key"} <= {c.lower() for c in schema}:
        raise Rejection(f"{uri}: fileSchema {', '.join(schema)[:200]!r} has no Bucket and Key columns")
    return InventoryReport(uri, dest, fmt, schema, files, sizes, md5s)  # type: ignore[arg-type]


def _md5(v: Any) -> str | None:
    """A hex MD5, or None (absent, or not an MD5: then the file is not checked)."""
    text = str(v).strip().lower() if isinstance(v, str) else ""
    return text if len(text) == 32 and all(c in "0123456789abcdef" for c in text) else None


def _size(v: Any) -> int | None:
    return int(v) if isinstance(v, int | str) and str(v).isdigit() else None
