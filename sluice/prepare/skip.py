"""The skip decision of one reduce partition, and the version records map workers send it. Pure: no I/O.

A version record is one string in a prepare part file (the shard format, its bucket field the
object's bucket), so the map side reuses sluice.prepare.router.Parts:

    <key> NUL <source> NUL <model> NUL <etag> NUL <version id or "">

source is CURRENT (-1) for the object version the input names now, else the earlier run's
place in the lineage (0 = input.since_run); model is the index of the record's model_id in
this run's distinct model ids. Valid keys hold no control character (sluice.aws.s3uri.bad_char),
ETags and version ids neither, so NUL separates; the key is split off from the right anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.outputs import object_version

CURRENT = -1
CONFLICT = "?"  # two sources name different versions of one key: it is embedded
NONE = 2**31 - 1  # odd: "no record", ranks after every real one


def record(key: str, source: int, model: int, etag: str, version_id: str | None) -> str:
    """One version record (the module docstring has its layout)."""
    return f"{key}\0{source}\0{model}\0{etag}\0{version_id or ''}"


def parse(rec: str) -> tuple[str, int, int, str, str | None]:
    """(key, source, model, etag, version id or None) of a record."""
    key, source, model, etag, vid = rec.rsplit("\0", 4)
    return key, int(source), int(model), etag, vid or None


def distinct(model_ids: Sequence[str]) -> list[str]:
    """The model ids once each, in order: two models of one artifact need one record, not two."""
    return list(dict.fromkeys(model_ids))


def matches(current: str, etag: str, version_id: str | None) -> bool:
    """Whether an earlier row was read from the version `current` (an object_version) names.

    The row's version id counts when the input names one (a versioned bucket's inventory, a
    HEAD); a listing names only ETags, and then the row's ETag alone is compared, so a prefix
    input skips unchanged objects of a versioned bucket too.
    """
    return current == object_version(etag, version_id) or current == object_version(etag, None)


class Skipper:
    """Current versions, then earlier records, of one partition: which keys every model already has.

    For each (key, model) only the newest record counts (lowest source rank), kept as one int:
    rank * 2, plus 1 when it does not match the current version, so min() keeps the newest and,
    at one rank, prefers a match (order-independent: the map workers' order does not matter).
    """

    def __init__(self, n_models: int) -> None:
        self.n_models = n_models
        self.current: dict[tuple[str, str], str] = {}
        self.best: dict[tuple[str, str], list[int]] = {}

    def add_current(self, bucket: str, key: str, etag: str, version_id: str | None) -> None:
        token = object_version(etag, version_id)
        k = (bucket, key)
        seen = self.current.setdefault(k, token)
        if seen != token:
            self.current[k] = CONFLICT

    def add_earlier(self, bucket: str, key: str, rank: int, model: int, etag: str, version_id: str | None) -> None:
        """An earlier row; call after every add_current (a key without a current version is never skipped)."""
        k = (bucket, key)
        token = self.current.get(k)
        if token is None or token == CONFLICT:
            return
        v = rank * 2 + (0 if matches(token, etag, version_id) else 1)
        slots = self.best.get(k)
        if slots is None:
            slots = self.best[k] = [NONE] * self.n_models
        if v < slots[model]:
            slots[model] = v

    def add(self, bucket: str, rec: str) -> None:
        """A record as the part files hold it."""
        key, source, model, etag, vid = parse(rec)
        if source == CURRENT:
            self.add_current(bucket, key, etag, vid)
        else:
            self.add_earlier(bucket, key, source, model, etag, vid)

    def skips(self, bucket: str, key: str) -> bool:
        """Every model's newest record matches the current version."""
        slots = self.best.get((bucket, key))
        return slots is not None and all(v % 2 == 0 for v in slots)

    def keep(self, bucket: str, keys: list[str]) -> list[str]:
        """The keys to embed."""
        if not self.best:
            return keys
        return [k for k in keys if not self.skips(bucket, k)]
