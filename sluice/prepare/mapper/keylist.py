"""A map worker's key-list range: the lines that start in it, read and checked as sluice.input.sources does."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator
from itertools import islice

from sluice.aws.s3uri import MAX_KEY_BYTES, bad_char, bucket_problem, is_bucket_name
from sluice.aws.store import CHUNK, ObjectStore
from sluice.contracts.prepare import KeyListRange
from sluice.errors import Rejection
from sluice.input.lines import LineTooLong, decode_lines
from sluice.input.sources import entry_to_pair, keylist_entries
from sluice.prepare.mapper.parts import WHERE, TaskProblems
from sluice.prepare.mapper.router import KeyRouter

TAIL_CHUNK = 64 * 2**10  # the line that crosses a range's end is read in small GETs
BATCH = 8192  # lines checked, and pairs routed, at a time
SHORT_KEY = MAX_KEY_BYTES // 4  # at most 256 characters: at most 1,024 UTF-8 bytes, no need to check
_OFFSET = re.compile(r"invalid byte at offset (\d+)")


class OwnedLines:
    """The bytes of the lines whose first byte is in [start, end) of a key list, and what they held."""

    def __init__(self, store: ObjectStore, task: KeyListRange, chunk: int = CHUNK) -> None:
        self._store, self._task, self._chunk = store, task, chunk
        self.first = task.start  # offset of the first owned line (set once found)
        self.lines = 0
        self._seen: list[tuple[int, int, bytes]] = []  # (stream offset, newlines before, chunk): the last two

    def chunks(self) -> Iterator[bytes]:
        for chunk in self._owned():
            offset = self._seen[-1][0] + len(self._seen[-1][2]) if self._seen else 0
            self._seen = [*self._seen[-1:], (offset, self.lines, chunk)]
            self.lines += chunk.count(b"\n")
            yield chunk
        if self._seen and not self._seen[-1][2].endswith(b"\n"):
            self.lines += 1  # the object's last line has no newline

    def _owned(self) -> Iterator[bytes]:
        t, store = self._task, self._store
        if t.start >= t.end:
            return
        skip = t.start > 0  # the line holding byte start-1 (if it is not a newline) is the previous range's
        pos = t.start - 1 if skip else 0
        last = b"\n"
        for chunk in store.stream(t.uri, pos, t.end, chunk=self._chunk):
            if skip:
                i = chunk.find(b"\n")
                pos += len(chunk) if i < 0 else i + 1
                if i < 0:
                    continue
                chunk, skip = chunk[i + 1 :], False
                self.first = pos
                if not chunk:
                    continue
            yield chunk
            last = chunk[-1:]
        if skip or last == b"\n":
            return  # no line starts in the range, or its last line ends exactly at `end`
        for chunk in store.stream(t.uri, t.end, chunk=min(self._chunk, TAIL_CHUNK)):
            i = chunk.find(b"\n")
            if i >= 0:
                yield chunk[: i + 1]
                return
            yield chunk

    def line_at(self, offset: int) -> int:
        """Line (within the task) holding stream offset `offset` (one of the last two chunks)."""
        for start, before, chunk in reversed(self._seen):
            if offset >= start:
                return before + chunk[: offset - start].count(b"\n") + 1
        return 1


def _header_line(header: list[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow(header)
    return buf.getvalue()


def map_keylist(task: KeyListRange, store: ObjectStore, default_bucket: str | None, sink: KeyRouter) -> int:
    """Validate and route the entries of one byte range; returns the lines it holds."""
    problems = sink.problems
    owned = OwnedLines(store, task)
    lines: Iterable[str] = decode_lines(owned.chunks(), task.uri, bom=task.start == 0)
    shift = 0
    if task.format == ".csv" and task.header and task.start > 0:
        lines, shift = _prepend(_header_line(task.header), lines), 1  # the header is line 1 of range 0 only
    good: set[str] = set()  # buckets parse_s3_uri accepted: later entries in them skip the regex
    try:
        if task.format == ".txt":
            n = 0
            it = iter(lines)
            while batch := list(islice(it, BATCH)):
                sink.pairs(_txt_batch(batch, n + 1, task.uri, default_bucket, good, sink))
                n += len(batch)
            return owned.lines
        pending: list[tuple[str, str]] = []
        n = 0
        for n, bucket, entry in keylist_entries(lines, task.uri, task.format):
            pair = _fast_pair(entry, bucket, default_bucket, good)
            if pair is None:
                problems.line = n - shift
                pair = _slow_pair(entry, bucket, default_bucket, problems)
                if pair is None:
                    continue
                good.add(pair[0])
            if sink.allowed and pair[0] not in sink.allowed:
                problems.line = n - shift
                sink.not_allowed(pair[0], pair[1], f"{WHERE}: ")
                continue
            pending.append(pair)
            if len(pending) >= BATCH:
                sink.pairs(pending)
                pending = []
        sink.pairs(pending)
    except csv.Error as exc:  # a carriage return inside an unquoted field: the csv module stops there
        problems.line = n - shift + 1
        problems.add(f"{WHERE}: not CSV: {exc}: quote fields that hold a carriage return")
    except LineTooLong as exc:  # the rest of the range is not lines either
        problems.line = owned.line_at(exc.offset)
        problems.add(f"{WHERE}: {exc.reasons[0].split(': ', 1)[1]}")
    except Rejection as exc:  # not UTF-8: the rest of the range cannot be read as lines
        m = _OFFSET.search(str(exc))
        at = int(m.group(1)) if m else 0
        problems.line = owned.line_at(at)
        problems.add(f"{WHERE}: not UTF-8 (invalid byte at offset {owned.first + at}): save the key list as UTF-8")
    return owned.lines


# A plain URI line: a bucket as is_bucket_name has it (less its ".." rule, checked after), then a key
# of 1..256 characters not ending in "/" or "\r", then at most one "\r" (keylist_entries drops it).
_URI_LINE = re.compile(
    rf"^s3://([a-z0-9][a-z0-9.\-]{{1,61}}[a-z0-9])/([^\n]{{0,{SHORT_KEY - 1}}}[^\n/\r])\r?$", re.MULTILINE
)
# Characters sluice.aws.s3uri.bad_char refuses, less \n (the batch's separator) and a \r ending a line (CRLF).
_DIRTY = re.compile(r"[\x00-\x09\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]|\r(?!\n|\Z)")
_SLOW = ("", "", "")  # a line the batch path leaves to sluice.input.sources' checks
_BARE = "\0bare"  # stands for the default bucket (never a bucket name: it has a NUL)


def _txt_batch(
    batch: list[str], first: int, uri: str, default: str | None, good: set[str], sink: KeyRouter
) -> list[tuple[str, str]]:
    """A batch of .txt lines -> valid pairs: plain lines in one regex or a few comprehensions, the rest one by one.

    A line is plain when keylist_entries and entry_to_pair would return it unchanged: an
    s3:// URI whose bucket is_bucket_name accepts (or a bare key, given a default bucket, with no
    "://"), a key of 1..256 characters not ending in "/" or "\\r" and not all blanks. Anything
    else goes through sluice.input.sources' own functions, with its line number, for their reasons.
    """
    joined = "\n".join(batch)
    dirty = _DIRTY.search(joined) is not None  # a control character (or a surrogate): line by line
    found = [] if dirty else _URI_LINE.findall(joined)
    if len(found) == len(batch) and not sink.allowed and not any(not is_bucket_name(b) for b in {b for b, _ in found}):
        return found  # every line a plain s3:// URI (one match a line at most: anchored at both ends)
    if default is None:
        split = [ln[5:].partition("/") if ln.startswith("s3://") else _SLOW for ln in batch]
    else:
        good.add(_BARE)
        split = [
            ln[5:].partition("/")
            if ln.startswith("s3://")
            else _SLOW
            if "://" in ln or ln[:1] == "\0"
            else (_BARE, "", ln)
            for ln in batch
        ]
    for b in {s[0] for s in split} - good:
        if b and is_bucket_name(b):
            good.add(b)
    ok = [
        b in good and 0 < len(k) <= SHORT_KEY and k[-1] != "/" and k[-1] != "\r" and not k.isspace()
        for b, _, k in split
    ]
    if dirty:
        ok = [y and not bad_char(k) for y, (_, _, k) in zip(ok, split)]
    d = default or ""  # _BARE is only in `split` when there is a default bucket
    pairs = [(d if b == _BARE else b, k) for (b, _, k), y in zip(split, ok) if y]
    if sink.allowed or not all(ok):
        pairs = []
        for i, ((b, _, k), y) in enumerate(zip(split, ok)):
            sink.problems.line = first + i
            pair: tuple[str, str] | None = (d if b == _BARE else b, k) if y else None
            if pair is None:
                for _, _, entry in keylist_entries([batch[i]], uri, ".txt"):  # blank lines yield nothing
                    pair = _slow_pair(entry, None, default, sink.problems)
            if pair is not None and not sink.not_allowed(pair[0], pair[1], f"{WHERE}: "):
                pairs.append(pair)
    return pairs


def _fast_pair(entry: str, bucket: str | None, default: str | None, good: set[str]) -> tuple[str, str] | None:
    """(bucket, key) when the entry is plainly valid, exactly as entry_to_pair would return it; else None."""
    if entry[:1] == "\0" or bad_char(entry):  # keylist_entries' own "this line is bad" marker, a control char
        return None
    if bucket is None and entry.startswith("s3://"):
        b, _, k = entry[5:].partition("/")
        if b in good and k and not k.endswith("/") and len(k) <= SHORT_KEY:
            return b, k
        return None
    b2 = default if bucket is None else bucket
    if b2 in good and "://" not in entry and entry and not entry.endswith("/") and len(entry) <= SHORT_KEY:
        return b2, entry  # "://" absent: not a URL (sluice.input.sources._SCHEME needs it)
    return None


def _slow_pair(entry: str, bucket: str | None, default: str | None, problems: TaskProblems) -> tuple[str, str] | None:
    """sluice.input.sources' checks with their reasons (as keylist_pairs does, with the line left to collect)."""
    if entry.startswith("\0"):
        problems.add(f"{WHERE}: {entry[1:]}")
        return None
    if bucket is not None and not entry.startswith("s3://"):
        if not is_bucket_name(bucket):
            problems.add(f"{WHERE}: {bucket_problem(bucket)}")
            return None
        return entry_to_pair(entry, bucket, WHERE, problems)
    return entry_to_pair(entry, default, WHERE, problems)


def _prepend(first: str, rest: Iterable[str]) -> Iterator[str]:
    yield first
    yield from rest
