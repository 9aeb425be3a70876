"""One model's Lance table: created once, updated by merges keyed by (key, model_id), newest row wins.

Its identity (model, model_id, dim, dtype) is the schema's metadata (`sluice.index`), written
when the table is created and checked by every build and search; the runs merged so far are
the table's config (`sluice.runs`), so a retried or repeated build of a run is a no-op.

Concurrency: every write is a Lance commit on top of the version it read. key and model_id
are Lance's unenforced primary key, so two merges that insert the same new key conflict
(without it Lance would take both inserts and double the row); the loser re-runs its merge
on the new version (`conflict_retries`). The update condition keeps a row whose run is newer
than the incoming one, so the order in which merges commit does not matter.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, TypeVar

from sluice.errors import SluiceError
from sluice.index.rows import RUN_ORDER, Shape, index_schema
from sluice.index.sources import IndexBuildError
from sluice.index.storage import storage_options
from sluice.log import logger

META_KEY = "sluice.index"
RUNS_KEY = "sluice.runs"
FORMAT = 1
CONFLICT_RETRIES = 20  # merges re-run on the newer version; each retry re-reads the source
RETRY_TIMEOUT = timedelta(minutes=30)
MERGE_ON = ["key", "part", "model_id"]
DROP_KEYS = 500  # keys a delete of stale parts names at once
# <table>.lance/_sluice_create_claim.json: written once, by the build that creates the table (inside the
# table's folder, so a table deleted to be rebuilt takes its claim along).
CREATE_CLAIM = "_sluice_create_claim.json"
CREATE_WAIT_S = 300
COMMIT_ATTEMPTS = 10  # a build's own retries of a commit another build's commit made stale
T = TypeVar("T")


def is_conflict(exc: BaseException) -> bool:
    """Lance's commit conflicts ("Commit conflict for version N ... Please retry")."""
    text = str(exc).lower()
    return "conflict" in text or "please retry" in text


def retry_conflicts(fn: Callable[[], T], what: str) -> T:
    """fn() again, on the table's new version, when another build's commit got in first (jittered backoff)."""
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        try:
            return fn()
        except (OSError, RuntimeError, ValueError) as exc:
            if attempt == COMMIT_ATTEMPTS or isinstance(exc, IndexBuildError) or not is_conflict(exc):
                raise
            logger.info("index: commit conflict, retrying on the new version", extra={"what": what, "attempt": attempt})
            time.sleep(min(5.0, 0.2 * 2**attempt) * random.uniform(0.5, 1.5))
    raise AssertionError("unreachable")


def creation_claimed(uri: str) -> bool:
    """Claim the creation of the table at `uri`: a put-if-absent of its claim file; False when taken.

    S3: PutObject with If-None-Match: * (S3's conditional writes: 412 PreconditionFailed when
    the object exists, 409 ConditionalRequestConflict for a concurrent one); local: O_EXCL.
    """
    claim = uri.rstrip("/") + "/" + CREATE_CLAIM
    body = json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "at": time.time()}).encode()
    if not claim.startswith("s3://"):
        os.makedirs(os.path.dirname(os.path.abspath(claim)), exist_ok=True)
        try:
            fd = os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
        return True
    from botocore.exceptions import ClientError

    from sluice.aws.clients import client
    from sluice.aws.s3uri import parse_s3_uri

    bucket, key = parse_s3_uri(claim)
    try:
        client("s3").put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
            return False
        raise
    return True


class IndexNotFound(SluiceError):
    """No index, or not one `sluice index build` wrote, at the path given."""


@dataclass(frozen=True)
class TableMeta:
    """The schema metadata of an index table."""

    format: int
    model: str
    model_id: str
    dim: int
    dtype: str
    # Where the artifact was and the input side it ran at (the plan's, when the first rows came with
    # one): what `sluice search --image/--text` embeds queries with. None: not known.
    model_uri: str | None = None
    image_size: int | None = None

    @classmethod
    def of(cls, shape: Shape, model_uri: str | None = None, image_size: int | None = None) -> TableMeta:
        return cls(FORMAT, shape.model, shape.model_id, shape.dim, shape.dtype, model_uri, image_size)

    @property
    def shape(self) -> Shape:
        return Shape(self.model, self.model_id, self.dim, self.dtype)


def _meta_of(ds: Any, uri: str) -> TableMeta:
    raw = (ds.schema.metadata or {}).get(META_KEY.encode())
    if not raw:
        raise IndexNotFound(f"{uri} is a Lance table that `sluice index build` did not write (no {META_KEY} metadata)")
    try:
        doc = json.loads(raw)
        return TableMeta(**{k: doc[k] for k in TableMeta.__dataclass_fields__ if k in doc})
    except (ValueError, KeyError, TypeError):
        raise IndexNotFound(f"{uri}: its {META_KEY} metadata is not an index's: rebuild it") from None


class IndexTable:
    """An open table; `dataset` is reloaded at its latest version before each use."""

    def __init__(self, uri: str, ds: Any) -> None:
        self.uri = uri
        self._ds = ds
        self.meta = _meta_of(ds, uri)

    @classmethod
    def open(cls, uri: str) -> IndexTable | None:
        """The table at `uri`, or None when there is none."""
        import lance

        try:
            ds = lance.dataset(uri, storage_options=storage_options(uri))
        except (ValueError, OSError) as exc:
            if "not found" in str(exc).lower() or "does not exist" in str(exc).lower():
                return None
            raise IndexNotFound(f"{uri} cannot be opened as a Lance table: {str(exc)[:300]}") from None
        return cls(uri, ds)

    @classmethod
    def open_or_create(cls, uri: str, meta: TableMeta) -> IndexTable:
        """The table at `uri` (checked to hold `meta`'s model), created empty when missing.

        Only the build that claims the creation (creation_claimed) creates it; the others wait
        for it. Two creates racing on S3 would both commit, the later as an Overwrite that can
        replace rows another build merged in between.
        """
        import lance

        table = cls.open(uri)
        if table is None:
            if creation_claimed(uri):
                schema = index_schema(meta.shape, {META_KEY: json.dumps(asdict(meta), sort_keys=True)})
                lance.write_dataset(
                    schema.empty_table(), uri, schema=schema, mode="create", storage_options=storage_options(uri)
                )
            table = cls._wait(uri)
        table.check(meta.shape, uri)
        return table

    @classmethod
    def _wait(cls, uri: str) -> IndexTable:
        """The table another build is creating, once it exists."""
        deadline = time.monotonic() + CREATE_WAIT_S
        while (table := cls.open(uri)) is None:
            if time.monotonic() > deadline:
                raise IndexBuildError(
                    f"{uri}: a build claimed its creation ({uri.rstrip('/')}/{CREATE_CLAIM}) but the table did not "
                    f"appear in {CREATE_WAIT_S} s: if no build is running, delete that file and build again"
                )
            time.sleep(0.5)
        return table

    def check(self, shape: Shape, what: str) -> None:
        """Refuse rows of another model_id (artifact or preprocessing) or dimension, naming both."""
        m = self.meta
        if (shape.model_id, shape.dim) != (m.model_id, m.dim):
            raise IndexBuildError(
                f"{what} holds {shape.dim}-d rows of model {shape.model!r} (model_id {shape.model_id}); the index "
                f"table {self.uri} holds {m.dim}-d rows of model {m.model!r} (model_id {m.model_id}): one model "
                "artifact and preprocessing a table: build into another index (`sluice index build --out`; a run: "
                "output.index.name), or pick the model (--model)"
            )

    @property
    def dataset(self) -> Any:
        """The table at its latest version (another build may have committed since it was opened)."""
        import lance

        self._ds = lance.dataset(self.uri, storage_options=storage_options(self.uri))
        return self._ds

    @property
    def current(self) -> Any:
        """The table as last loaded (searches reuse it: no manifest read per query)."""
        return self._ds

    def runs(self) -> list[str]:
        """The runs merged so far (a retried build of one of them has nothing to do)."""
        return list(json.loads(self.dataset.config().get(RUNS_KEY, "[]")))

    def record_run(self, run_id: str) -> None:
        ds = self.dataset
        runs = list(json.loads(ds.config().get(RUNS_KEY, "[]")))
        if run_id not in runs:
            ds.update_config({RUNS_KEY: json.dumps([*runs, run_id])})

    def merge(self, reader: Any) -> dict[str, int]:
        """Upsert `reader`'s rows: insert new (key, model_id), replace a row whose run is not newer."""
        builder = (
            self.dataset.merge_insert(MERGE_ON)
            .when_matched_update_all(f"source.{RUN_ORDER} >= target.{RUN_ORDER}")
            .when_not_matched_insert_all()
            .conflict_retries(CONFLICT_RETRIES)
            .retry_timeout(RETRY_TIMEOUT)
        )
        try:
            stats = builder.execute(reader)
        except OSError as exc:
            if "Ambiguous merge insert" in str(exc):
                raise IndexBuildError(
                    f"the rows given hold one key twice ({str(exc).split('on (', 1)[-1].split(')')[0]}): "
                    "give each key once, or build the sets one after another, oldest first"
                ) from None
            raise
        return {k: int(v) for k, v in dict(stats).items()}

    def drop_stale_parts(self, keys: set[str], order: str) -> None:
        """Delete the rows of `keys` from older runs: a key is replaced whole (a shorter text leaves no old chunk)."""
        ds = self.dataset
        todo = sorted(keys)
        for i in range(0, len(todo), DROP_KEYS):
            names = ", ".join("'" + k.replace("'", "''") + "'" for k in todo[i : i + DROP_KEYS])
            ds.delete(f"{RUN_ORDER} < '{order}' AND key IN ({names})")

    def has_parts(self) -> bool:
        """Whether the table holds a key of several parts (text, video): only then can a merge leave stale ones."""
        return bool(self.dataset.count_rows("part > 0"))

    def count_rows(self) -> int:
        return int(self.dataset.count_rows())
