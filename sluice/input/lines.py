"""A UTF-8 byte stream as lines, in bounded memory: the one line reader of key lists and inventory CSV."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from sluice.errors import Rejection

BOM = b"\xef\xbb\xbf"
# A key is at most 1,024 bytes; a line 1,000 times that is no key-list line, and holding it
# is the only memory a line reader needs beyond its chunk.
MAX_LINE_BYTES = 2**20
KEY_LIST = "not a key-list line (is this a key list?)"  # what a line that long is not, by default


class LineTooLong(Rejection):
    """A line longer than MAX_LINE_BYTES: `offset` is where it starts in the stream, `line` its number."""

    def __init__(self, uri: str, line: int, offset: int, what: str = KEY_LIST) -> None:
        self.line, self.offset = line, offset
        name = uri.rsplit("/", 1)[-1]
        super().__init__(f"{name} line {line}: longer than {MAX_LINE_BYTES} bytes: {what}")


def _not_utf8(uri: str, at: int) -> Rejection:
    return Rejection(f"{uri}: not UTF-8 (invalid byte at offset {at}): save the file as UTF-8")


def decode_lines(chunks: Iterable[bytes], uri: str, *, bom: bool = True, what: str = KEY_LIST) -> Iterator[str]:
    """Lines (split on \\n; a \\r before it is the caller's) of a UTF-8 stream, never holding more than a chunk
    and one line. `bom`: the stream starts at the object's first byte, where a UTF-8 BOM is dropped;
    `what`: what a line over MAX_LINE_BYTES is not (the rejection says it)."""
    tail = b""
    offset = 0  # stream offset of tail's first byte
    line = 1  # number of the line tail starts
    pending_bom = bom
    for chunk in chunks:
        data = tail + chunk
        if pending_bom:
            if len(data) < len(BOM) and BOM.startswith(data):
                tail = data
                continue
            pending_bom = False
            if data.startswith(BOM):
                data = data[len(BOM) :]
                offset += len(BOM)
        cut = data.rfind(b"\n") + 1
        if cut == 0:
            if len(data) > MAX_LINE_BYTES:
                raise LineTooLong(uri, line, offset, what)
            tail = data
            continue
        try:
            text = data[:cut].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(uri, offset + exc.start) from exc
        lines = text.split("\n")
        lines.pop()  # empty string after the final newline
        if lines and max(map(len, lines)) > MAX_LINE_BYTES // 4:  # a character is at most 4 bytes
            _check_lengths(lines, uri, line, offset, what)
        offset += cut
        line += len(lines)
        tail = data[cut:]
        yield from lines
    if pending_bom and tail.startswith(BOM):
        tail, offset = tail[len(BOM) :], offset + len(BOM)
    if tail:
        if len(tail) > MAX_LINE_BYTES:
            raise LineTooLong(uri, line, offset, what)
        try:
            yield tail.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(uri, offset + exc.start) from exc


def _check_lengths(lines: list[str], uri: str, first: int, offset: int, what: str) -> None:
    at = offset
    for i, s in enumerate(lines):
        n = len(s.encode("utf-8", "surrogatepass"))
        if n > MAX_LINE_BYTES:
            raise LineTooLong(uri, first + i, at, what)
        at += n + 1
