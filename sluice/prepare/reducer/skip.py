"""The skip decision of one reduce partition, and the version records map workers send it. Pure: no I/O.

A version record is one string in a prepare part file (the shard format, its bucket field the
object's bucket), so the map side reuses sluice.prepare.mapper.router.Parts:

    <key> NUL <source> NUL <model> NUL <etag> NUL <version id or "">

source is CURRENT (-1) for the object version the input names now, else the earlier run's
place in the lineage (0 = input.since_run); model is the index of the record's model_id in
this run's distinct model ids, or FAILED (-1) for an earlier failure of the object's bytes
(failures/<i>.jsonl: a reason of contracts.BYTES_FAILURE_REASONS, with the version read), which
stands for every model: decoding failed before any model ran. Valid keys hold no control
character (sluice.aws.s3uri.bad_char), ETags and version ids neither, so NUL separates; the key
is split off from the right anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.outputs import object_version

CURRENT = -1
FAILED = -1  # the model field of an earlier failure of the bytes (every model)
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


ROW, FAILURE, OTHER = 0, 1, 2  # what a key's newest record for a model says: a row or a failure of its current version


class Skipper:
    """Current versions, then earlier records, of one partition: which keys every model already has.

    For each (key, model) only the newest record counts (lowest source rank), kept as one int:
    rank * 4 + ROW (a row of the current version), FAILURE (its current bytes failed) or OTHER
    (another version), so min() keeps the newest and, at one rank, prefers a row
    (order-independent: the map workers' order does not matter). A key is skipped when every
    model's newest record is of its current version; `known_bad` counts those of them that
    failed (the same bytes would fail again, and a run would count them against its threshold).
    """

    def __init__(self, n_models: int) -> None:
        self.n_models = n_models
        self.current: dict[tuple[str, str], str] = {}
        self.best: dict[tuple[str, str], list[int]] = {}
        self.known_bad = 0

    def add_current(self, bucket: str, key: str, etag: str, version_id: str | None) -> None:
        token = object_version(etag, version_id)
        k = (bucket, key)
        seen = self.current.setdefault(k, token)
        if seen != token:
            self.current[k] = CONFLICT

    def add_earlier(self, bucket: str, key: str, rank: int, model: int, etag: str, version_id: str | None) -> None:
        """An earlier row (model FAILED: a failure of the bytes); call after every add_current.

        A key without a current version is never skipped.
        """
        k = (bucket, key)
        token = self.current.get(k)
        if token is None or token == CONFLICT:
            return
        same = ROW if model != FAILED else FAILURE
        v = rank * 4 + (same if matches(token, etag, version_id) else OTHER)
        slots = self.best.get(k)
        if slots is None:
            slots = self.best[k] = [NONE] * self.n_models
        for m in range(self.n_models) if model == FAILED else (model,):
            if v < slots[m]:
                slots[m] = v

    def add(self, bucket: str, rec: str) -> None:
        """A record as the part files hold it."""
        key, source, model, etag, vid = parse(rec)
        if source == CURRENT:
            self.add_current(bucket, key, etag, vid)
        else:
            self.add_earlier(bucket, key, source, model, etag, vid)

    def skips(self, bucket: str, key: str) -> bool:
        """Every model's newest record is of the current version (a row, or a failure of those bytes)."""
        slots = self.best.get((bucket, key))
        return slots is not None and all(v != NONE and v % 4 != OTHER for v in slots)

    def keep(self, bucket: str, keys: list[str]) -> list[str]:
        """The keys to embed; counts the skipped ones whose bytes failed before in `known_bad`."""
        if not self.best:
            return keys
        kept = []
        for k in keys:
            if not self.skips(bucket, k):
                kept.append(k)
            elif any(v % 4 == FAILURE for v in self.best[(bucket, k)]):
                self.known_bad += 1
        return kept
