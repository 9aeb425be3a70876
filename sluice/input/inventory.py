"""S3 Inventory reports as keys: manifest.json verified, data files decoded in bounded memory.

The manifest Lambda (sluice.input.keys.iter_keys) and the prepare map workers read data files
with the same functions. Every decode problem (not gzip, truncated, not CSV, not Parquet, a
schema without a Key column, a compression bomb) is a Rejection that names the data
file; a row's problem names its line. Decompressed bytes count against limits while
streaming, so a small .csv.gz that inflates to gigabytes stops at the limit, not after.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import tempfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import unquote_plus

from botocore.exceptions import BotoCoreError, ClientError

from sluice.aws.errors import Kind, classify
from sluice.aws.s3uri import MAX_KEY_BYTES, bad_char, bucket_problem, is_bucket_name, key_problem, parse_s3_uri, s3_uri
from sluice.errors import Rejection
from sluice.input import strictjson
from sluice.input.lines import decode_lines
from sluice.input.sources import BATCH_KEYS, KeyBatch, Problems, batched, get_chunks, s3_error
from sluice.log import logger
from sluice.paths import MANIFESTS_PREFIX
from sluice.settings import MAX_INFLATE_RATIO, MAX_INFLATED_BYTES, Settings

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# A data file whose "line" is over the limit (binary, Parquet or ORC under a CSV report, damaged).
NOT_CSV = (
    "not a row of an inventory CSV file: the file is damaged, or not the gzip CSV its manifest.json's fileFormat "
    "names (a Parquet or ORC report lists .parquet / .orc files)"
)
CHECKSUM_SUFFIX = ".checksum"
OUT_CHUNK = 2**20  # decompressed bytes produced at a time
SLACK = 2**20  # any file may inflate to this much, whatever its ratio


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


def _bomb(name: str, out: int, seen: int, limit: int) -> Rejection:
    return Rejection(
        f"inventory file {name}: inflates past {limit} bytes ({out} from {seen} compressed): a compression bomb "
        "or an oversized file (SLUICE_MAX_INFLATED_BYTES, SLUICE_MAX_INFLATE_RATIO); split the report"
    )


def inflate(
    chunks: Iterable[bytes], name: str, max_inflated: int = MAX_INFLATED_BYTES, ratio: int = MAX_INFLATE_RATIO
) -> Iterator[bytes]:
    """gzip (one member or several) -> at most OUT_CHUNK bytes at a time, within the limits."""
    d = zlib.decompressobj(wbits=31)
    seen = out = 0
    for chunk in chunks:
        seen += len(chunk)
        data = chunk
        while True:
            if d.eof:
                if not data:
                    break
                d = zlib.decompressobj(wbits=31)  # another gzip member follows
            try:
                piece = d.decompress(data, OUT_CHUNK)
            except zlib.error as exc:
                raise Rejection(f"inventory file {name}: not gzip data ({exc}): is the file damaged?") from exc
            data = d.unused_data if d.eof else d.unconsumed_tail
            if piece:
                out += len(piece)
                # The ratio against the compressed bytes consumed so far, not those received: a bomb
                # that arrives in one chunk stops after SLACK + ratio x what it took, not the chunk's.
                limit = min(max_inflated, ratio * (seen - len(data)) + SLACK)
                if out > limit:
                    raise _bomb(name, out, seen, limit)
                yield piece
            if not data and len(piece) < OUT_CHUNK:
                break
    if seen and not d.eof:
        raise Rejection(f"inventory file {name}: the gzip data is truncated: is the file complete?")


@dataclass(frozen=True)
class _CsvColumns:
    """Where a CSV data file's rows hold their bucket and key, and how wide its fileSchema is."""

    bucket: int
    key: int
    width: int
    good: set[str] = field(default_factory=set)  # buckets already found valid (filled as rows are read)


def _columns(columns: list[str], name: str) -> _CsvColumns:
    lower = [c.strip().lower() for c in columns]
    if "key" not in lower or "bucket" not in lower:
        raise Rejection(f"inventory file {name}: fileSchema {', '.join(columns)[:200]!r} has no Bucket and Key columns")
    return _CsvColumns(lower.index("bucket"), lower.index("key"), len(columns))


def csv_keys(
    data: bytes | Iterable[bytes],
    columns: list[str],
    name: str,
    problems: Problems,
    max_inflated: int = MAX_INFLATED_BYTES,
    ratio: int = MAX_INFLATE_RATIO,
) -> Iterator[KeyBatch]:
    """A gzip CSV data file's keys (URL-decoded, folder markers skipped); rows' problems name their line."""
    cols = _columns(columns, name)
    chunks = [data] if isinstance(data, bytes | bytearray) else data
    reader = csv.reader(decode_lines(inflate(chunks, name, max_inflated, ratio), name, what=NOT_CSV))

    def pairs() -> Iterator[tuple[str, str]]:
        try:
            for row in reader:
                pair = _row(row, cols, f"inventory file {name} line {reader.line_num}", problems)
                if pair is not None:
                    yield pair
        except csv.Error as exc:
            raise Rejection(f"inventory file {name} line {reader.line_num}: not CSV: {exc}") from exc

    return batched(pairs())


def _row(row: list[str], cols: _CsvColumns, where: str, problems: Problems) -> tuple[str, str] | None:
    """A CSV row's (bucket, key); None for a blank row, a folder marker or a bad row (its problem noted)."""
    if not row:
        return None
    if len(row) <= max(cols.bucket, cols.key):
        problems.add(f"{where}: row has {len(row)} columns, fileSchema has {cols.width}")
        return None
    bucket = row[cols.bucket]
    if bucket not in cols.good:
        why = bucket_problem(bucket)
        if why:
            problems.add(f"{where}: {why}")
            return None
        cols.good.add(bucket)
    try:
        key = unquote_plus(row[cols.key], errors="strict")  # inventory CSV keys are URL-encoded
    except UnicodeDecodeError:
        problems.add(f"{where}: key {row[cols.key][:80]!r} is not URL-encoded UTF-8")
        return None
    return _key(bucket, key, where, problems)


def _key(bucket: str, key: str, where: str, problems: Problems) -> tuple[str, str] | None:
    if key.endswith("/"):
        return None  # a folder marker
    if not key or len(key) > MAX_KEY_BYTES // 4:
        why = key_problem(key)
        if why:
            problems.add(f"{where}: {why}")
            return None
    return bucket, key


def parquet_keys(
    data: bytes | str,
    name: str,
    problems: Problems,
    max_inflated: int = MAX_INFLATED_BYTES,
    ratio: int = MAX_INFLATE_RATIO,
) -> Iterator[KeyBatch]:
    """A Parquet data file's keys (`data`: its bytes or a local path), a batch at a time; size and schema first."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise Rejection(f"inventory file {name}: Parquet inventories need pyarrow installed") from exc
    try:
        pf = pq.ParquetFile(io.BytesIO(data) if isinstance(data, bytes) else data)
        size = len(data) if isinstance(data, bytes) else os.path.getsize(data)
        names = {n.lower(): n for n in pf.schema_arrow.names}
        meta = pf.metadata
        want = {names.get("bucket"), names.get("key")}
        inflated = sum(
            meta.row_group(g).column(c).total_uncompressed_size
            for g in range(meta.num_row_groups)
            for c in range(meta.num_columns)
            if meta.row_group(g).column(c).path_in_schema in want
        )
    except Exception as exc:  # pyarrow's ArrowInvalid, OSError ...: the file is not Parquet
        raise Rejection(f"inventory file {name}: not a readable Parquet file ({type(exc).__name__}: {exc})") from exc
    if "key" not in names or "bucket" not in names:
        raise Rejection(
            f"inventory file {name}: has no bucket and key columns (it has {', '.join(sorted(names))[:200]})"
        )
    limit = min(max_inflated, ratio * size + SLACK)
    if inflated > limit:
        raise _bomb(name, inflated, size, limit)
    return batched(_parquet_pairs(pf, [names["bucket"], names["key"]], name, problems))


# ---- object versions, for incremental runs (sluice.prepare.mapper.versions) -----------------

Version = tuple[str, str | None]  # (ETag, version id)
VersionBatch = tuple[str, list[str], list[Version | None]]


@dataclass(frozen=True)
class VersionFields:
    """Where an inventory row's object version is: column indexes (CSV) or names (Parquet)."""

    etag: int
    version_id: int | None
    latest: int | None
    delete_marker: int | None


def version_fields(columns: Sequence[str]) -> VersionFields | None:
    """The version columns among `columns` (CSV ETag/VersionId/IsLatest/IsDeleteMarker or Parquet e_tag/...)."""
    norm = [c.strip().lower().replace("_", "") for c in columns]
    if "etag" not in norm:
        return None

    def at(name: str) -> int | None:
        return norm.index(name) if name in norm else None

    return VersionFields(norm.index("etag"), at("versionid"), at("islatest"), at("isdeletemarker"))


def no_etag_reason(where: str) -> str:
    """Why an inventory without ETags cannot be an incremental run's input, and what to do."""
    return (
        f"{where}: the inventory has no ETag field, which an incremental run (input.since_run) compares with the "
        "earlier output: add ETag (and VersionId for a versioned bucket) to the inventory configuration's "
        "optional fields and use a report delivered after that, or name the keys in input.key_list (each key is "
        "then HEADed)"
    )


def _version(values: Sequence[Any], f: VersionFields) -> Version | None:
    """The object version a row names; None for an older version, a delete marker or no ETag."""

    def text(i: int | None) -> str:
        return "" if i is None or i >= len(values) or values[i] is None else str(values[i]).strip()

    if f.latest is not None and text(f.latest).lower() not in ("true", ""):
        return None  # a noncurrent version of a versioned bucket: its key's latest row names the version
    if f.delete_marker is not None and text(f.delete_marker).lower() == "true":
        return None
    etag = text(f.etag).strip('"')
    return (etag, text(f.version_id) or None) if etag else None


def _batched_versions(rows: Iterable[tuple[str, str, Version | None]]) -> Iterator[VersionBatch]:
    """Consecutive same-bucket rows as (bucket, keys, versions) of at most BATCH_KEYS."""
    bucket, keys, versions = "", [], []  # type: ignore[var-annotated]
    for b, k, v in rows:
        if keys and (b != bucket or len(keys) >= BATCH_KEYS):
            yield bucket, keys, versions
            keys, versions = [], []
        bucket = b
        keys.append(k)
        versions.append(v)
    if keys:
        yield bucket, keys, versions


def csv_versions(
    data: bytes | Iterable[bytes],
    columns: list[str],
    name: str,
    problems: Problems,
    max_inflated: int = MAX_INFLATED_BYTES,
    ratio: int = MAX_INFLATE_RATIO,
) -> Iterator[VersionBatch]:
    """csv_keys with each key's object version (its fileSchema must name ETag)."""
    cols = _columns(columns, name)
    fields = version_fields(columns)
    if fields is None:
        raise Rejection(no_etag_reason(f"inventory file {name}"))
    chunks = [data] if isinstance(data, bytes | bytearray) else data
    reader = csv.reader(decode_lines(inflate(chunks, name, max_inflated, ratio), name, what=NOT_CSV))

    def rows() -> Iterator[tuple[str, str, Version | None]]:
        try:
            for row in reader:
                pair = _row(row, cols, f"inventory file {name} line {reader.line_num}", problems)
                if pair is not None:
                    yield pair[0], pair[1], _version(row, fields)
        except csv.Error as exc:
            raise Rejection(f"inventory file {name} line {reader.line_num}: not CSV: {exc}") from exc

    return _batched_versions(rows())


def parquet_versions(data: bytes | str, name: str, problems: Problems) -> Iterator[VersionBatch]:
    """parquet_keys with each key's object version (the file must have an e_tag column)."""
    import pyarrow.parquet as pq

    keys = parquet_keys(data, name, problems)  # the same checks first: readable, bucket and key, no bomb
    del keys
    pf = pq.ParquetFile(io.BytesIO(data) if isinstance(data, bytes) else data)
    names = pf.schema_arrow.names
    fields = version_fields(names)
    if fields is None:
        raise Rejection(no_etag_reason(f"inventory file {name}"))
    lower = {n.lower(): n for n in names}
    extra = [i for i in (fields.etag, fields.version_id, fields.latest, fields.delete_marker) if i is not None]
    cols = [lower["bucket"], lower["key"], *(names[i] for i in extra)]
    at = {i: 2 + j for j, i in enumerate(extra)}  # where each version column is in `cols`

    def moved(i: int | None) -> int | None:
        return None if i is None else at[i]

    local = VersionFields(at[fields.etag], moved(fields.version_id), moved(fields.latest), moved(fields.delete_marker))
    return _batched_versions(_parquet_version_rows(pf, cols, local, name, problems))


def _parquet_version_rows(
    pf: Any, cols: list[str], fields: VersionFields, name: str, problems: Problems
) -> Iterator[tuple[str, str, Version | None]]:
    for bucket, key, values in _parquet_rows(pf, cols, name, problems):
        yield bucket, key, _version(values, fields)


def _parquet_pairs(pf: Any, cols: list[str], name: str, problems: Problems) -> Iterator[tuple[str, str]]:
    for bucket, key, _ in _parquet_rows(pf, cols, name, problems):
        yield bucket, key


def _parquet_rows(
    pf: Any, cols: list[str], name: str, problems: Problems
) -> Iterator[tuple[str, str, tuple[Any, ...]]]:
    """(bucket, key, row values) of each valid row (cols: bucket, key, ...); bad rows go to `problems`."""
    row = 0
    good: set[str] = set()
    try:
        for batch in pf.iter_batches(batch_size=8192, columns=cols):
            columns = [batch.column(i).to_pylist() for i in range(len(cols))]
            for values in zip(*columns, strict=True):
                row += 1
                bucket, key = values[0], values[1]
                where = f"inventory file {name} row {row}"
                if not isinstance(bucket, str) or not isinstance(key, str):
                    problems.add(
                        f"{where}: bucket and key must be strings (got {type(bucket).__name__}, {type(key).__name__})"
                    )
                    continue
                if bucket not in good:
                    if not is_bucket_name(bucket):
                        problems.add(f"{where}: {bucket_problem(bucket)}")
                        continue
                    good.add(bucket)
                if _key(bucket, key, where, problems) is not None:
                    yield bucket, key, values
    except Rejection:
        raise
    except Exception as exc:  # a damaged page or row group
        raise Rejection(
            f"inventory file {name}: cannot be read as Parquet at row {row + 1} ({type(exc).__name__}: {exc})"
        ) from exc


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
