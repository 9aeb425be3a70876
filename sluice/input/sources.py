"""Where keys come from: key-list objects (.txt / .csv / .jsonl), prefix listings and inline keys.

Each source streams (bucket, [keys]) batches and validates as it goes: every problem becomes a
reason naming the line or key and why (Problems); a problem a caller acts on also keeps its
structured form (Problem: a code, where, the key), so no caller parses a reason's text. S3
Inventory reports are sluice.input.inventory (their data files' rows sluice.input.inventory_files);
sluice.input.keys chooses the source a manifest names.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from sluice.aws.errors import Kind, classify
from sluice.aws.s3uri import MAX_KEY_BYTES, bad_char, bucket_problem, is_bucket_name, key_problem, parse_s3_uri, s3_uri
from sluice.errors import MAX_REASONS, Rejection, RetriableError
from sluice.input import strictjson
from sluice.input.lines import decode_lines

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

KeyBatch = tuple[str, list[str]]


BATCH_KEYS = 8192


KEYLIST_SUFFIXES = (".txt", ".csv", ".jsonl")


_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


BLANK = " \t\r"  # a line of only these is blank; str.strip() would also drop control characters


BUCKET_HINT = "set input.bucket, or set SLUICE_DEFAULT_INPUT_BUCKET"


BARE_KEY = "bare_key"  # Problem.code: a key without s3:// where no bucket is given for it


@dataclass(frozen=True)
class Problem:
    """One problem in its structured form: what kind (`code`), where, the key it is about, and its reason."""

    code: str
    where: str  # "<name> line <n>" or "input.keys[<i>]", as the reason begins
    text: str  # the reason, exactly as Problems.reasons holds it
    key: str | None = None  # the entry as the reason shows it (its first 80 characters)


class Problems:
    """Collects up to MAX_REASONS problems, then stops the scan.

    `bucket_hint`: how a bare key gets its bucket where the keys are read (the CLI names its flag).
    `details`: the structured form of the first MAX_REASONS problems noted with one (note()).
    """

    def __init__(self, bucket_hint: str = BUCKET_HINT) -> None:
        self.reasons: list[str] = []
        self.details: list[Problem] = []
        self.count = 0
        self.bucket_hint = bucket_hint

    def note(self, problem: Problem) -> None:
        """Add a problem's reason and keep its structured form."""
        if len(self.details) < MAX_REASONS:
            self.details.append(problem)
        self.add(problem.text)

    def add(self, reason: str) -> None:
        self.count += 1
        if len(self.reasons) < MAX_REASONS:
            self.reasons.append(reason)
        if self.count >= MAX_REASONS:
            self.raise_if_any()

    def raise_if_any(self) -> None:
        if self.count:
            extra = self.count - len(self.reasons)
            raise Rejection(self.reasons + ([f"... and {extra} more problems"] if extra > 0 else []))


def batched(pairs: Iterable[tuple[str, str]]) -> Iterator[KeyBatch]:
    """Group consecutive same-bucket (bucket, key) pairs into KeyBatch lists of at most BATCH_KEYS."""
    bucket = ""
    keys: list[str] = []
    for b, k in pairs:
        if keys and (b != bucket or len(keys) >= BATCH_KEYS):
            yield bucket, keys
            keys = []
        bucket = b
        keys.append(k)
    if keys:
        yield bucket, keys


def entry_to_pair(entry: str, default_bucket: str | None, where: str, problems: Problems) -> tuple[str, str] | None:
    """One key-list entry (bare key or s3:// URI) -> (bucket, key), or None after noting why not."""
    why = bad_char(entry)
    if why:
        problems.add(f"{where}: not a key: {entry[:80]!r} holds {why}")
        return None
    if entry != entry.strip() and entry.strip().startswith("s3://"):
        # A key may hold spaces, so none is dropped unasked: the line is named with what to remove.
        problems.add(f"{where}: not a key: {entry.strip()[:80]!r} has spaces around it ({entry[:80]!r}): remove them")
        return None
    if entry.startswith("s3://"):
        try:
            bucket, key = parse_s3_uri(entry)
        except ValueError as exc:
            problems.add(f"{where}: not a key: {exc}")
            return None
    elif _SCHEME.match(entry):
        problems.add(f"{where}: not a key: {entry[:80]!r} is a URL; use s3://bucket/key or a bare key")
        return None
    else:
        if default_bucket is None:
            shown = entry[:80]
            text = f"{where}: bare key {shown!r} but no bucket: write s3://bucket/key, {problems.bucket_hint}"
            problems.note(Problem(BARE_KEY, where, text, key=shown))
            return None
        bucket, key = default_bucket, entry
    if key.endswith("/"):
        problems.add(f"{where}: not a key: {entry[:80]!r} ends with '/' (a prefix); use input.prefix to list it")
        return None
    if len(key) > MAX_KEY_BYTES // 4:  # only long keys can exceed 1,024 UTF-8 bytes
        why = key_problem(key)
        if why:
            problems.add(f"{where}: {why}: {entry[:80]!r}...")
            return None
    return bucket, key


def _lines(chunks: Iterable[bytes], uri: str, *, bom: bool = True) -> Iterator[str]:
    """Decode a UTF-8 byte stream into lines (sluice.input.lines: BOM dropped, bounded line length)."""
    return decode_lines(chunks, uri, bom=bom)


def keylist_entries(lines: Iterable[str], uri: str, kind: str) -> Iterator[tuple[int, str | None, str]]:
    """Yield (line number, explicit bucket or None, entry) from .txt/.csv/.jsonl lines."""
    if kind == ".txt":
        for n, line in enumerate(lines, 1):
            line = line.removesuffix("\r")
            if line.strip(BLANK):
                yield n, None, line
        return
    if kind == ".jsonl":
        for n, line in enumerate(lines, 1):
            if not line.strip(BLANK):
                continue
            yield (n, *_jsonl_entry(line))
        return
    # .csv: optional header naming uri / key / bucket; else 1 column = key or URI, 2+ = bucket,key
    cols: dict[str, int] | None = None
    for n, line in enumerate(lines, 1):
        try:  # a line at a time: one bad line (a bare \r in a field) is that line's problem
            row = next(csv.reader([line.removesuffix("\r")]), [])
        except csv.Error as exc:
            why = "a field is too long to be a key" if "field limit" in str(exc) else "quote the field"
            yield n, None, f"\0not CSV: {exc} ({why})"
            continue
        if not row or not any(c.strip(BLANK) for c in row):
            continue
        if n == 1 and {c.strip().lower() for c in row} & {"uri", "key", "s3_uri", "url"}:
            cols = {c.strip().lower(): i for i, c in enumerate(row)}
            continue
        try:
            if cols is not None:
                uri_col = cols.get("uri", cols.get("s3_uri", cols.get("url")))
                if uri_col is not None:
                    yield n, None, row[uri_col]
                else:
                    b = row[cols["bucket"]] if "bucket" in cols else None
                    yield n, b, row[cols["key"]]
            elif len(row) == 1:
                yield n, None, row[0]
            else:
                yield n, row[0], row[1]
        except IndexError:
            yield n, None, "\0row has fewer columns than its header"


def _jsonl_entry(line: str) -> tuple[str | None, str]:
    """(explicit bucket or None, entry) of one .jsonl line; an entry starting with NUL is a reason."""
    try:
        obj = json.loads(line, object_pairs_hook=strictjson.object_pairs)
    except strictjson.Duplicate as exc:
        return None, f"\0field {str(exc)[:40]!r} appears twice in one object: keep one"
    except json.JSONDecodeError as exc:
        return None, f"\0not JSON: {exc.msg} at column {exc.colno}"
    except (ValueError, RecursionError) as exc:  # an integer of 5,000 digits, [[[[...
        return None, f"\0not JSON: {type(exc).__name__}: {str(exc)[:80]}"
    if isinstance(obj, str):
        return None, obj
    if isinstance(obj, dict):
        bucket = obj.get("bucket")
        if bucket is not None and not isinstance(bucket, str):
            return None, "\0not a key: 'bucket' must be a string"
        if isinstance(obj.get("uri"), str):
            if "key" in obj or bucket is not None:
                return None, "\0not a key: give 'uri', or 'key' and 'bucket', not both"
            return None, obj["uri"]
        if isinstance(obj.get("key"), str):
            return bucket, obj["key"]
    return None, "\0not a key: expected a JSON string or an object with 'uri' or 'key'"


def iter_keylist(
    chunks: Iterable[bytes], uri: str, kind: str, default_bucket: str | None, problems: Problems
) -> Iterator[KeyBatch]:
    """Stream a key-list object as batches; problems name the line."""
    return batched(keylist_pairs(chunks, uri, kind, default_bucket, problems))


def keylist_pairs(
    chunks: Iterable[bytes], uri: str, kind: str, default_bucket: str | None, problems: Problems
) -> Iterator[tuple[str, str]]:
    name = uri.rsplit("/", 1)[-1]
    for n, bucket, entry in keylist_entries(_lines(chunks, uri), uri, kind):
        where = f"{name} line {n}"
        if entry.startswith("\0"):
            problems.add(f"{where}: {entry[1:]}")
            continue
        if bucket is not None and not entry.startswith("s3://"):
            if not is_bucket_name(bucket):
                problems.add(f"{where}: {bucket_problem(bucket)}")
                continue
            pair = entry_to_pair(entry, bucket, where, problems)
        else:
            pair = entry_to_pair(entry, default_bucket, where, problems)
        if pair is not None:
            yield pair


def s3_error(exc: BaseException, what: str) -> Exception:
    """Translate an S3 error at the boundary (sluice.aws.errors): retriable (raise) or a rejection reason."""
    failure = classify(exc)
    if failure.retriable:
        return RetriableError(f"{what}: S3 {failure.code}; will retry")
    if failure.kind is Kind.NOT_FOUND:
        if failure.code == "NoSuchBucket":
            return Rejection(f"{what}: the bucket does not exist")
        return Rejection(f"{what} does not exist")
    if failure.kind is Kind.DENIED and failure.status == 0:  # NoCredentialsError: no request was made
        return Rejection(
            f"{what} cannot be read: no AWS credentials ({failure.code}): configure them (aws configure, "
            "AWS_PROFILE, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)"
        )
    if failure.kind is Kind.DENIED:
        return Rejection(f"{what} cannot be read: access denied (grant the coordinator role read access)")
    return Rejection(f"{what} cannot be read: S3 {failure.code}: {failure.message or exc}")


def get_chunks(
    s3: S3Client,
    bucket: str,
    key: str,
    max_bytes: int,
    limit_name: str = "SLUICE_MAX_KEYLIST_BYTES",
    chunk: int = 8 * 2**20,
) -> Iterator[bytes]:
    what = s3_uri(bucket, key)
    try:
        resp = s3.get_object(Bucket=bucket, Key=key)
    except (ClientError, BotoCoreError, OSError) as exc:
        raise s3_error(exc, what) from exc
    size = int(resp.get("ContentLength") or 0)
    over = f"over the {max_bytes}-byte limit ({limit_name})"
    if size > max_bytes:
        raise Rejection(f"{what} is {size} bytes, {over}")
    body = resp["Body"]
    read = 0
    while True:
        try:
            data = body.read(chunk)
        except (ClientError, BotoCoreError, OSError) as exc:  # the connection dropped mid-body: retried
            raise s3_error(exc, what) from exc
        if not data:
            break
        read += len(data)
        if read > max_bytes:
            raise Rejection(f"{what} is {over}")
        yield data


def iter_prefix(s3: S3Client, uri: str, suffixes: tuple[str, ...] | None) -> Iterator[KeyBatch]:
    """List s3://bucket/prefix page by page; folder markers are skipped."""
    bucket, prefix = parse_s3_uri(uri, allow_empty_key=True)
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    seen_any = False
    try:
        for page in pages:
            keys = [o["Key"] for o in page.get("Contents", ()) if not o["Key"].endswith("/")]
            if suffixes:
                keys = [k for k in keys if k.lower().endswith(suffixes)]
            if keys:
                seen_any = True
                yield bucket, keys
    except (ClientError, BotoCoreError) as exc:
        raise s3_error(exc, f"prefix {uri}") from exc
    if not seen_any:
        raise Rejection(f"prefix {uri} matched no objects" + (f" ending in {suffixes}" if suffixes else ""))


def inline_keys(entries: list[str], default_bucket: str | None, problems: Problems) -> Iterator[KeyBatch]:
    def pairs() -> Iterator[tuple[str, str]]:
        for i, entry in enumerate(entries):
            if not isinstance(entry, str) or not entry:
                problems.add(f"input.keys[{i}]: not a key: empty")
                continue
            pair = entry_to_pair(entry, default_bucket, f"input.keys[{i}]", problems)
            if pair is not None:
                why = key_problem(pair[1]) if len(pair[1]) > MAX_KEY_BYTES // 4 else None
                if why:
                    problems.add(f"input.keys[{i}]: {why}")
                    continue
                yield pair

    return batched(pairs())
