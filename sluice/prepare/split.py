"""Cut an input into prepare tasks and size it cheaply: runs in the manifest Lambda, never reads the whole input.

Numbers (documented in one place, used by choose_workers / choose_partitions):

* one map worker per KEYS_PER_WORKER = 5M keys, 2..128 workers: a worker validates and routes
  0.33-0.5M keys/s on one vCPU (bench/prepare.py), so 5M keys is 10-15 s of CPU plus its reads;
  the cap keeps P*R part objects and a reducer's fan-in (P GETs) small.
* one reduce worker per KEYS_PER_PARTITION = 4M keys (estimated, duplicates included): a
  reducer holds its partition's keys as Python strings in lists, a set and sorted lists, about
  150 bytes a key measured (511 MiB peak at 3.3M keys), so 4M keys is ~600 MB: an estimate 3x
  too low still stays under the 2 GB goal.
* inventory data files: INVENTORY_BYTES_PER_KEY (20 for gzip CSV, 25 for Parquet) is the low end
  of what realistic reports measure (21-43 B/key gzip CSV, 33-65 B/key Parquet, 3 to 6 fields):
  too low a ratio over-counts keys, which costs idle workers, not memory.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import TYPE_CHECKING, Literal

from sluice.aws.s3uri import s3_uri
from sluice.aws.store import ObjectStore
from sluice.contracts.prepare import InventoryFiles, KeyListRange, PrefixRange
from sluice.input.inventory import InventoryReport, read_inventory_manifest
from sluice.prepare import prepare_store

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

KeyListFormat = Literal[".txt", ".csv", ".jsonl"]
KEYS_PER_WORKER = 5_000_000
MIN_WORKERS, MAX_WORKERS = 2, 128
KEYS_PER_PARTITION = 4_000_000
MAX_PARTITIONS = 512  # a map worker keeps one spill file open per partition
SAMPLE_BYTES = 64 * 2**10
INVENTORY_BYTES_PER_KEY = {"CSV": 20, "PARQUET": 25}
MAX_INVENTORY_HEADS = 64  # data files HEADed when manifest.json lists no sizes; the rest get their mean
TASKS_PER_WORKER = 4  # prefix ranges per worker: listing rates vary, round-robin evens them out
HEADER_NAMES = frozenset({"uri", "key", "s3_uri", "url"})  # as sluice.input.sources.keylist_entries reads a header
SUCCESSOR_DEPTH = 16  # characters after the prefix the unlisted rest is split at
DEFAULT_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


# ---- sizing ------------------------------------------------------------------------------


def choose_workers(estimated_keys: int) -> int:
    """P: one map worker per KEYS_PER_WORKER keys, within MIN_WORKERS..MAX_WORKERS."""
    return max(MIN_WORKERS, min(MAX_WORKERS, math.ceil(estimated_keys / KEYS_PER_WORKER)))


def choose_partitions(estimated_keys: int, mode: Literal["array", "multinode"] = "array", nodes: int = 1) -> int:
    """R: multinode has one shard per node, so R = nodes; else one per KEYS_PER_PARTITION keys."""
    if mode == "multinode":
        return nodes
    return max(1, min(MAX_PARTITIONS, math.ceil(estimated_keys / KEYS_PER_PARTITION)))


# ---- key lists ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyListEstimate:
    """A key list's size and keys estimated from its first SAMPLE_BYTES (exact when that is all of it)."""

    uri: str
    format: KeyListFormat
    size: int
    keys_estimate: int
    bytes_per_line: float
    header: list[str] | None
    exact: bool


def keylist_format(uri: str) -> KeyListFormat:
    """.txt, .csv or .jsonl from the name (anything else reads as .txt, as sluice.input.keys.iter_keys does)."""
    lower = uri.lower()
    for fmt in (".csv", ".jsonl", ".txt"):
        if lower.endswith(fmt):
            return fmt  # type: ignore[return-value]
    return ".txt"


def estimate_keylist(store: ObjectStore, uri: str, size: int | None = None) -> KeyListEstimate:
    """HEAD (unless `size` is known) and one ranged GET of the first 64 KiB: bytes a line -> keys; the .csv header."""
    fmt = keylist_format(uri)
    size = store.size(uri) if size is None else size
    sample = store.get_range(uri, 0, min(size, SAMPLE_BYTES))
    exact = len(sample) >= size
    cut = len(sample) if exact else sample.rfind(b"\n") + 1
    text = sample[:cut].decode("utf-8", "replace").removeprefix("\ufeff")  # a BOM is no part of the header
    lines = text.splitlines()
    header = _csv_header(lines[0]) if fmt == ".csv" and lines else None
    body = lines[1:] if header else lines
    if exact:
        return KeyListEstimate(
            uri, fmt, size, sum(1 for x in body if x.strip()), cut / max(1, len(lines)), header, True
        )
    bpl = cut / len(lines) if lines else float(max(1, len(sample)))  # no newline in 64 KiB: one huge line
    return KeyListEstimate(uri, fmt, size, max(1, round(size / bpl) - (1 if header else 0)), bpl, header, False)


def _csv_header(line: str) -> list[str] | None:
    try:
        row = next(csv.reader([line.removesuffix("\r")]), [])
    except csv.Error:  # not CSV: no header; the reader rejects the line with its number
        return None
    return row if {c.strip().lower() for c in row} & HEADER_NAMES else None


def keylist_tasks(
    uri: str, size: int, fmt: KeyListFormat, header: list[str] | None, workers: int
) -> list[KeyListRange]:
    """`workers` contiguous byte ranges of [0, size); a line belongs to the range holding its first byte."""
    n = max(1, workers)
    return [
        KeyListRange(uri=uri, format=fmt, start=size * i // n, end=size * (i + 1) // n, header=header) for i in range(n)
    ]


# ---- inventories -------------------------------------------------------------------------


@dataclass(frozen=True)
class InventoryEstimate:
    """The report with every size known (listed, HEADed or the mean) and the keys estimated from them."""

    report: InventoryReport
    total_bytes: int
    keys_estimate: int


def estimate_inventory(store: ObjectStore, uri: str, max_heads: int = MAX_INVENTORY_HEADS) -> InventoryEstimate:
    """Read manifest.json (one small GET), HEAD at most `max_heads` unsized data files; keys = bytes / ratio."""
    report = read_inventory_manifest(store.get(uri), uri)
    sizes = list(report.sizes)
    missing = [i for i, s in enumerate(sizes) if s is None]
    for i in missing[:max_heads]:
        sizes[i] = store.size(s3_uri(report.bucket, report.files[i]))
    known = [s for s in sizes if s is not None]
    mean = sum(known) // len(known) if known else 0
    full = [mean if s is None else s for s in sizes]
    total = sum(full)
    keys = max(1, total // INVENTORY_BYTES_PER_KEY[report.format])
    return InventoryEstimate(replace(report, sizes=list(full)), total, keys)


def inventory_tasks(report: InventoryReport, workers: int) -> list[InventoryFiles]:
    """The data files over at most `workers` tasks by size (greedy, largest first); files keep report order."""
    sizes = [s or 0 for s in (report.sizes or [None] * len(report.files))]
    sizes += [0] * (len(report.files) - len(sizes))
    bins: list[list[int]] = [[] for _ in range(max(1, min(workers, len(report.files))))]
    loads = [0] * len(bins)
    for i in sorted(range(len(report.files)), key=lambda i: (-sizes[i], i)):
        b = min(range(len(bins)), key=lambda j: (loads[j], j))
        bins[b].append(i)
        loads[b] += sizes[i]
    chosen = sorted((sorted(b) for b in bins if b), key=lambda b: b[0])
    return [
        InventoryFiles(
            bucket=report.bucket,
            keys=[report.files[i] for i in b],
            format=report.format,
            columns=report.columns,
            first_file=b[0],
        )
        for b in chosen
    ]


# ---- prefixes ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefixEstimate:
    """Keys listed under a prefix in at most max_pages pages; exact when the listing ended."""

    listed: int
    exact: bool
    keys_estimate: int


def _store(s3: S3Client | ObjectStore) -> ObjectStore:
    return s3 if isinstance(s3, ObjectStore) else prepare_store(s3)


def estimate_prefix(
    s3: S3Client | ObjectStore, bucket: str, prefix: str, *, max_pages: int = 10, max_keys: int = 100_000_000
) -> PrefixEstimate:
    """Count keys (folder markers skipped) in up to `max_pages` pages; unfinished: size for `max_keys`.

    A listing that did not end says nothing about how many keys follow, so the estimate is the
    most a run may hold (SLUICE_MAX_KEYS): reducers then stay under their memory goal however
    big the prefix is, at the cost of a few idle workers.
    """
    store = _store(s3)
    listed, token = 0, None
    for _ in range(max_pages):
        page, _cps = store.list_page(bucket, prefix, token=token)
        listed += sum(1 for k in page.keys if not k.endswith("/"))
        if not page.truncated:
            return PrefixEstimate(listed, True, listed)
        token = page.token
    return PrefixEstimate(listed, False, max(listed, max_keys))


def prefix_tasks(
    s3: S3Client | ObjectStore, bucket: str, prefix: str, workers: int, max_pages: int = 10
) -> list[PrefixRange]:
    """Contiguous key ranges under `prefix`, about TASKS_PER_WORKER per worker, from one Delimiter="/" listing.

    Every boundary ends with "/": a range is start_after < key < stop_at, so the only key no
    range holds is one equal to a boundary, which is a folder marker (skipped anyway). Ranges
    split at common prefixes when there are enough of them, else at the next one or two
    characters (from the keys seen) after the prefix or after each common prefix.
    """
    store = _store(s3)
    target = max(1, TASKS_PER_WORKER * workers)
    if target == 1:
        return [PrefixRange(bucket=bucket, prefix=prefix)]
    cps, sample, complete = _fan_out(store, bucket, prefix, max_pages)
    bounds: set[str] = set(_evenly(cps, target))
    if len(cps) < target:
        bases = cps or [prefix]
        if not sample:  # only common prefixes were listed: look inside the first one
            page, _ = store.list_page(bucket, bases[0])
            sample = page.keys
        alphabet = _alphabet(sample, bases)
        bounds |= set(_evenly(_char_bounds(bases, alphabet, target), target))
    if cps and not complete:  # the listing stopped early: fan out after the last common prefix seen
        bounds |= set(_successors(cps[-1], prefix, _alphabet(cps, [prefix])))
    edges: list[str | None] = [None, *sorted(b for b in bounds if b.startswith(prefix)), None]
    return [PrefixRange(bucket=bucket, prefix=prefix, start_after=a, stop_at=b) for a, b in pairwise(edges)]


def _fan_out(store: ObjectStore, bucket: str, prefix: str, max_pages: int) -> tuple[list[str], list[str], bool]:
    """(common prefixes, keys directly under the prefix, whether the listing ended) in at most max_pages."""
    cps: list[str] = []
    keys: list[str] = []
    token = None
    for _ in range(max_pages):
        page, prefixes = store.list_page(bucket, prefix, token=token, delimiter="/")
        cps += prefixes
        keys += page.keys
        if not page.truncated:
            return sorted(cps), keys, True
        token = page.token
    return sorted(cps), keys, False


def _evenly(items: list[str], target: int) -> list[str]:
    """About target - 1 items spread evenly over the sorted items (the boundaries of target ranges)."""
    if len(items) < target:
        return list(items)
    return sorted({items[i * len(items) // target] for i in range(1, target)})


def _alphabet(sample: list[str], bases: list[str]) -> str:
    """Characters that follow the bases in the sampled keys (the default when too few are seen)."""
    chars: set[str] = set()
    for k in sample:
        base = next((b for b in bases if k.startswith(b)), "")
        chars.update(k[len(base) :])
    chars.discard("/")
    return "".join(sorted(chars)) if len(chars) >= 2 else DEFAULT_ALPHABET


def _char_bounds(bases: list[str], alphabet: str, target: int) -> list[str]:
    """base + one (or, when that gives too few, two) characters + "/" for every base."""
    if len(bases) * len(alphabet) >= target:
        return sorted(b + c + "/" for b in bases for c in alphabet)
    return sorted(b + c + d + "/" for b in bases for c in alphabet for d in alphabet)


def _successors(last: str, prefix: str, alphabet: str) -> list[str]:
    """Boundaries above `last` at every depth below the prefix: the unlisted rest split geometrically."""
    out = []
    for i in range(len(prefix), min(len(last), len(prefix) + SUCCESSOR_DEPTH)):
        out += [last[:i] + c + "/" for c in alphabet if c > last[i]]
    return out


# An incremental reducer holds, besides its keys, their current versions and the newest earlier
# record per key and model (~2x the memory a key takes otherwise): twice the partitions.
PARTITION_FACTOR = 2
