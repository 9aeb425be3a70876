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
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from sluice.errors import SluiceError
from sluice.index.rows import RUN_ORDER, Shape, index_schema
from sluice.index.sources import IndexBuildError
from sluice.index.storage import storage_options

META_KEY = "sluice.index"
RUNS_KEY = "sluice.runs"
FORMAT = 1
CONFLICT_RETRIES = 20  # merges re-run on the newer version; each retry re-reads the source
RETRY_TIMEOUT = timedelta(minutes=30)
MERGE_ON = ["key", "model_id"]


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
        """The table at `uri` (checked to hold `meta`'s model), created empty when missing."""
        import lance

        shape = meta.shape
        table = cls.open(uri)
        if table is None:
            doc = json.dumps(asdict(meta), sort_keys=True)
            schema = index_schema(shape, {META_KEY: doc})
            try:
                lance.write_dataset(
                    schema.empty_table(), uri, schema=schema, mode="create", storage_options=storage_options(uri)
                )
            except (OSError, ValueError) as exc:  # another build created it first: use theirs
                if "exist" not in str(exc).lower():
                    raise
            table = cls.open(uri)
            if table is None:  # pragma: no cover - created above or by the other build
                raise IndexBuildError(f"{uri}: the table vanished while it was created")
        table.check(shape, uri)
        return table

    def check(self, shape: Shape, what: str) -> None:
        """Refuse rows of another model artifact or dimension, naming both."""
        m = self.meta
        if (shape.model_id, shape.dim) != (m.model_id, m.dim):
            raise IndexBuildError(
                f"{what} holds {shape.dim}-d rows of model {shape.model!r} (model_id {shape.model_id}); the index "
                f"table {self.uri} holds {m.dim}-d rows of model {m.model!r} (model_id {m.model_id}): one model "
                "artifact a table: build into another index (--out), or pick the model (--model)"
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

    def count_rows(self) -> int:
        return int(self.dataset.count_rows())
