"""S3 Inventory data files as keys: gzip CSV and Parquet rows, decoded in bounded memory.

The manifest Lambda (through sluice.input.inventory's report) and the prepare map workers read
data files with these functions. Every decode problem (not gzip, truncated, not CSV, not Parquet,
a schema without a Key column, a compression bomb) is a Rejection that names the data file; a
row's problem names its line (CSV) or row (Parquet). Decompressed bytes count against limits
while streaming, so a small .csv.gz that inflates to gigabytes stops at the limit, not after.
"""

from __future__ import annotations

import csv
import io
import os
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote_plus

from sluice.aws.s3uri import MAX_KEY_BYTES, bucket_problem, is_bucket_name, key_problem
from sluice.errors import Rejection
from sluice.input.lines import decode_lines
from sluice.input.sources import BATCH_KEYS, KeyBatch, Problems, batched
from sluice.settings import MAX_INFLATE_RATIO, MAX_INFLATED_BYTES

# A data file whose "line" is over the limit (binary, Parquet or ORC under a CSV report, damaged).
NOT_CSV = (
    "not a row of an inventory CSV file: the file is damaged, or not the gzip CSV its manifest.json's fileFormat "
    "names (a Parquet or ORC report lists .parquet / .orc files)"
)
OUT_CHUNK = 2**20  # decompressed bytes produced at a time
SLACK = 2**20  # any file may inflate to this much, whatever its ratio


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
    rows = _csv_rows(data, _columns(columns, name), name, problems, max_inflated, ratio)
    return batched((bucket, key) for bucket, key, _ in rows)


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
    rows = _csv_rows(data, cols, name, problems, max_inflated, ratio)
    return _batched_versions((bucket, key, _version(row, fields)) for bucket, key, row in rows)


def _csv_rows(
    data: bytes | Iterable[bytes], cols: _CsvColumns, name: str, problems: Problems, max_inflated: int, ratio: int
) -> Iterator[tuple[str, str, list[str]]]:
    """(bucket, key, row) of each valid row of a gzip CSV data file; bad rows go to `problems`, naming their line."""
    chunks = [data] if isinstance(data, bytes | bytearray) else data
    reader = csv.reader(decode_lines(inflate(chunks, name, max_inflated, ratio), name, what=NOT_CSV))
    try:
        for row in reader:
            pair = _row(row, cols, f"inventory file {name} line {reader.line_num}", problems)
            if pair is not None:
                yield pair[0], pair[1], row
    except csv.Error as exc:
        raise Rejection(f"inventory file {name} line {reader.line_num}: not CSV: {exc}") from exc


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
    pf, names = _parquet_file(data, name, max_inflated, ratio)
    rows = _parquet_rows(pf, [names["bucket"], names["key"]], name, problems)
    return batched((bucket, key) for bucket, key, _ in rows)


def parquet_versions(data: bytes | str, name: str, problems: Problems) -> Iterator[VersionBatch]:
    """parquet_keys with each key's object version (the file must have an e_tag column)."""
    pf, lower = _parquet_file(data, name, MAX_INFLATED_BYTES, MAX_INFLATE_RATIO)  # parquet_keys' checks, first
    names = pf.schema_arrow.names
    fields = version_fields(names)
    if fields is None:
        raise Rejection(no_etag_reason(f"inventory file {name}"))
    extra = [i for i in (fields.etag, fields.version_id, fields.latest, fields.delete_marker) if i is not None]
    cols = [lower["bucket"], lower["key"], *(names[i] for i in extra)]
    at = {i: 2 + j for j, i in enumerate(extra)}  # where each version column is in `cols`

    def moved(i: int | None) -> int | None:
        return None if i is None else at[i]

    local = VersionFields(at[fields.etag], moved(fields.version_id), moved(fields.latest), moved(fields.delete_marker))
    rows = _parquet_rows(pf, cols, name, problems)
    return _batched_versions((bucket, key, _version(values, local)) for bucket, key, values in rows)


def _parquet_file(data: bytes | str, name: str, max_inflated: int, ratio: int) -> tuple[Any, dict[str, str]]:
    """The opened file (pyarrow's ParquetFile) and its column names by lower case; readable, keyed, no bomb."""
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
    return pf, names


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
