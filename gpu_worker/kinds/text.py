"""Text objects -> chunks of a model's token window -> one embedding each (docs/kinds.md).

An object is text when it is UTF-8 (a BOM accepted) or UTF-16 with a BOM; anything else is
`not_text`, and so is one that decodes but holds NUL bytes (a binary file named .txt). One with
no characters but whitespace is `empty`. Its tokens are cut into chunks of `chunk_tokens` that
repeat the last `overlap_tokens` of the chunk before; each chunk is one output row whose
part_start / part_end are the character offsets it covers. Chunks are made lazily from a
token stream, so a text's memory is its characters plus its chunks' ids (int32), and the worker's
max_object_bytes (64 MiB) refuses a larger object (`too_large`) before its body is read.

Models: builtin:reference-text (seeded random weights, a word tokenizer that needs no file:
for the demo and tests, like builtin:reference-cnn). This module never imports torch at
import time: only `load_text_model` does.
"""

from __future__ import annotations

import codecs
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpu_worker.errors import ConfigError, ObjectFailure
from sluice.contracts.status import FailureReason

SEED = 20240601
VOCAB = 32_768  # hashed word ids of the builtin tokenizer; 0 pads
_WORD = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class TextWindow:
    """A text model's chunking: tokens a chunk holds and repeats from the one before."""

    chunk_tokens: int
    overlap_tokens: int

    def check(self) -> None:
        """Raise ConfigError unless 0 <= overlap < chunk."""
        if not 0 <= self.overlap_tokens < self.chunk_tokens:
            raise ConfigError(
                f"overlap_tokens ({self.overlap_tokens}) must be at least 0 and less than chunk_tokens "
                f"({self.chunk_tokens})"
            )


@dataclass(frozen=True)
class TextChunk:
    """One chunk of one text: its index, the characters [start, end) it covers, its token ids."""

    part: int
    start: int
    end: int
    ids: np.ndarray  # int32: 4 bytes a token, so a long text's chunks stay small


class Tokenizer(Protocol):
    def tokens(self, text: str) -> Iterator[tuple[int, int, int]]:
        """(token id, start, end character offsets) of each token of `text`, in order."""
        ...


class WordTokenizer:
    """Words and punctuation marks, each hashed (CRC-32 of its lower case) to an id in [1, VOCAB)."""

    CACHE = 65_536  # words whose id is kept (a text's vocabulary repeats: most tokens are a dict hit)

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}

    def _id(self, word: str) -> int:
        i = 1 + zlib.crc32(word.lower().encode()) % (VOCAB - 1)
        if len(self._ids) < self.CACHE:
            self._ids[word] = i
        return i

    def tokens(self, text: str) -> Iterator[tuple[int, int, int]]:
        ids = self._ids
        for m in _WORD.finditer(text):
            word = m.group()
            a, b = m.span()
            yield ids.get(word) or self._id(word), a, b


def decode_text(data: bytes) -> str:
    """The characters of one object; ObjectFailure not_text / empty for what is not a text to embed."""
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        encoding, body = "utf-16", data
    else:
        encoding, body = "utf-8", data[3:] if data.startswith(codecs.BOM_UTF8) else data
    try:
        text = body.decode(encoding)
    except UnicodeDecodeError as exc:
        raise ObjectFailure(
            FailureReason.NOT_TEXT, f"not UTF-8, nor UTF-16 with a BOM: byte {exc.start} does not decode"
        ) from None
    if "\x00" in text:
        raise ObjectFailure(FailureReason.NOT_TEXT, f"NUL character at {text.index(chr(0))}: a binary file")
    if not text.strip():
        raise ObjectFailure(FailureReason.EMPTY, f"no characters but whitespace ({len(data)} bytes)")
    return text


def chunks(tokens: Iterable[tuple[int, int, int]], window: TextWindow) -> Iterator[TextChunk]:
    """Chunks of `window.chunk_tokens` tokens, each repeating the last `overlap_tokens` of the one before."""
    step = window.chunk_tokens - window.overlap_tokens
    buf: list[tuple[int, int, int]] = []
    fresh, part = 0, 0  # tokens not yet in any chunk
    for tok in tokens:
        buf.append(tok)
        fresh += 1
        if len(buf) == window.chunk_tokens:
            yield TextChunk(part, buf[0][1], buf[-1][2], np.array([t[0] for t in buf], np.int32))
            part += 1
            buf, fresh = buf[step:], 0
    if fresh:
        yield TextChunk(part, buf[0][1], buf[-1][2], np.array([t[0] for t in buf], np.int32))


def text_chunks(data: bytes, tokenizer: Tokenizer, window: TextWindow) -> list[TextChunk]:
    """One object's chunks; ObjectFailure for bytes that are not text, or text without a token."""
    out = list(chunks(tokenizer.tokens(decode_text(data)), window))
    if not out:
        raise ObjectFailure(FailureReason.EMPTY, "no token: nothing to embed")
    return out


@dataclass(frozen=True)
class Framing:
    """How a model takes a chunk: special ids around it, padded with pad_id to `length` tokens."""

    length: int
    pad_id: int = 0
    prefix: tuple[int, ...] = ()
    suffix: tuple[int, ...] = ()
    # The padded lengths the network takes, ascending (a traced file's buckets); empty: any length.
    lengths: tuple[int, ...] | None = None

    @property
    def room(self) -> int:
        """Tokens of text a chunk can hold."""
        return self.length - len(self.prefix) - len(self.suffix)

    def padded(self, need: int) -> int:
        """The length a batch whose longest framed chunk has `need` tokens is padded to."""
        if self.lengths is None:
            return self.length  # a fixed shape: the full length
        return next((n for n in self.lengths if n >= need), need if not self.lengths else self.length)


def pad_ids(parts: list[TextChunk], framing: Framing, length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, attention mask), both (len(parts), length or framing.length) int64: prefix, chunk, suffix, padding."""
    width = length or framing.length
    ids = np.full((len(parts), width), framing.pad_id, np.int64)
    mask = np.zeros((len(parts), width), np.int64)
    head, tail = len(framing.prefix), len(framing.suffix)
    for i, p in enumerate(parts):
        body = p.ids[: framing.room]
        n = head + len(body) + tail
        ids[i, :head] = framing.prefix
        ids[i, head : head + len(body)] = body
        ids[i, head + len(body) : n] = framing.suffix
        mask[i, :n] = 1
    return ids, mask


class FileTokenizer:
    """A `tokenizers` tokenizer (the artifact's tokenizer.json), fed blocks of text so memory stays bounded."""

    BLOCK = 100_000  # characters an encode call takes (cut at a space when there is one)

    def __init__(self, tok: Any) -> None:
        tok.no_truncation()
        tok.no_padding()
        self._tok = tok

    def tokens(self, text: str) -> Iterator[tuple[int, int, int]]:
        start = 0
        while start < len(text):
            end = min(len(text), start + self.BLOCK)
            if end < len(text):
                cut = text.rfind(" ", start + self.BLOCK // 2, end)
                end = cut if cut > start else end
            enc = self._tok.encode(text[start:end], add_special_tokens=False)
            for i, (a, b) in zip(enc.ids, enc.offsets):
                yield int(i), start + a, start + b
            start = end


class ReferenceText:
    """builtin:reference-text's network, built on demand (torch): hashed-word embeddings, masked mean, linear."""

    DIM = 128
    WINDOW = TextWindow(256, 32)

    @staticmethod
    def build() -> Any:
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = nn.Embedding(VOCAB, ReferenceText.DIM, padding_idx=0)
                self.proj = nn.Linear(ReferenceText.DIM, ReferenceText.DIM)

            def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
                m = mask.unsqueeze(-1).float()
                pooled = (self.embed(ids) * m).sum(1) / m.sum(1).clamp(min=1.0)
                return self.proj(torch.tanh(pooled))  # type: ignore[no-any-return]

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            return Net().eval()
