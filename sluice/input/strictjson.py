"""JSON as a manifest needs it: one meaning per document, or a Rejection that says where.

Python's json module lets the last of two equal keys win, accepts NaN and Infinity, returns
lone UTF-16 surrogates ("\\ud800") that no UTF-8 writer can store later, and raises
RecursionError or a bare ValueError (integers over 4,300 digits) for inputs it cannot hold.
`loads` turns each of these into a rejection reason, strips a leading UTF-8 BOM (editors on
Windows write one) and bounds the nesting depth.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.errors import Rejection

MAX_DEPTH = 32  # a run manifest is 3 levels deep; anything far deeper is not one
BOM = "\ufeff"


class Duplicate(ValueError):
    pass


def object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise Duplicate(k)
        out[k] = v
    return out


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def decode_utf8(raw: bytes, where: str) -> str:
    """UTF-8 text without its BOM; Rejection naming the first bad byte."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Rejection(f"{where}: not UTF-8 (invalid byte at offset {exc.start}): save it as UTF-8") from exc
    return text.removeprefix(BOM)


def loads(raw: bytes | str, where: str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse one JSON document strictly; every problem is a Rejection naming `where`."""
    text = decode_utf8(raw, where) if isinstance(raw, bytes) else raw.removeprefix(BOM)
    try:
        doc = json.loads(text, object_pairs_hook=object_pairs, parse_constant=_constant)
    except Duplicate as exc:
        raise Rejection(
            f"{where}: field {str(exc)[:80]!r} appears twice in one object: keep one (JSON readers disagree on "
            "which wins)"
        ) from None
    except json.JSONDecodeError as exc:
        raise Rejection(f"{where}: not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise Rejection(f"{where}: nested deeper than {max_depth} levels: not a manifest") from None
    except ValueError as exc:  # NaN / Infinity, an integer too long to convert
        raise Rejection(f"{where}: not valid JSON: {str(exc)[:160]}") from None
    _check_tree(doc, where, max_depth)
    return doc


def _check_tree(doc: Any, where: str, max_depth: int) -> None:
    """Depth within max_depth, and every string storable as UTF-8 (no lone surrogates)."""
    stack: list[tuple[Any, int, str]] = [(doc, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            raise Rejection(f"{where}: nested deeper than {max_depth} levels: not a manifest")
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            sub = f"{path}.{k}" if isinstance(k, str) else f"{path}[{k}]"
            if isinstance(k, str) and not _utf8(k):
                raise Rejection(f"{where}: field name at {path or 'top level'}: {_SURROGATE}")
            if isinstance(v, str):
                if not _utf8(v):
                    raise Rejection(f"{where}: {sub.lstrip('.')}: {_SURROGATE}")
            elif isinstance(v, dict | list):
                stack.append((v, depth + 1, sub))
    if isinstance(doc, str) and not _utf8(doc):
        raise Rejection(f"{where}: {_SURROGATE}")


_SURROGATE = "holds a lone UTF-16 surrogate escape (\\ud800-\\udfff), which is not a character: fix the escape"


def _utf8(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
