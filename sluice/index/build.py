"""A build: SOURCEs -> one Lance table per model in the index folder, merged, then (re)indexed.

Each run (or set of Parquet files) is one merge, streamed chunk by chunk (never the whole run
in memory): a bad chunk stops the merge before it commits, so a failed build leaves the
table as it was. Runs of a lineage the table already holds are skipped; the rest merge in any
order (the newest row per (key, model_id) wins: sluice.index.table). Then each table touched
gets its ANN index (sluice.index.ann) and a key index.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from typing import Any

from sluice import outputs
from sluice.contracts.events import IndexedTable, RunIndexed
from sluice.index import ann
from sluice.index.rows import Shape, duplicate_key, index_schema, read_ahead, read_chunk, shape_of, to_index_rows
from sluice.index.sources import IndexBuildError, RunOutput, resolve
from sluice.index.storage import Files
from sluice.index.table import IndexTable, TableMeta, retry_conflicts
from sluice.log import logger
from sluice.paths import index_table_uri


class EmptySource(IndexBuildError):
    """The sources hold no committed row: no index is written."""


@dataclass
class TableReport:
    """One model's table after the build."""

    model: str
    model_id: str
    uri: str
    dim: int
    rows: int = 0
    inserted: int = 0
    updated: int = 0
    ann: str = ann.NONE
    merged: list[str] = field(default_factory=list)  # what was merged: run ids or the SOURCE as given
    merge_s: float = 0.0  # reading the chunks and committing the merges
    index_s: float = 0.0  # training / extending the ANN and key indexes
    skipped: list[str] = field(default_factory=list)  # runs the table already held


@dataclass
class BuildReport:
    """What `sluice index build` prints (--json) and the index stage reports ("Run Indexed")."""

    index: str
    seconds: float = 0.0
    tables: list[TableReport] = field(default_factory=list)
    # A build with --workers: each segment child's work (FleetChild: rows, seconds, peak_rss_mb).
    children: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tables)

    @property
    def ann(self) -> str:
        kinds = {t.ann for t in self.tables}
        return kinds.pop() if len(kinds) == 1 else ",".join(sorted(kinds))

    def indexed(self, run_id: str) -> RunIndexed:
        """The "Run Indexed" detail of this build."""
        tables = [
            IndexedTable(model=t.model, model_id=t.model_id, uri=t.uri, rows=t.rows, ann=t.ann) for t in self.tables
        ]
        return RunIndexed(
            run_id=run_id,
            index_uri=self.index,
            rows=self.rows,
            seconds=round(self.seconds, 3),
            ann=self.ann,
            tables=tables,
        )

    def as_dict(self) -> dict[str, Any]:
        return (
            {"index": self.index, "rows": self.rows, "ann": self.ann, "seconds": round(self.seconds, 3)}
            | {"tables": [asdict(t) for t in self.tables]}
            | ({"children": self.children} if self.children else {})
        )


class _Rows:
    """One RunOutput's rows as index rows, chunk by chunk, every chunk checked against the first."""

    def __init__(self, files: Files, out: RunOutput) -> None:
        self.files, self.out = files, out
        self._chunks = read_ahead(lambda u: read_chunk(files, u), out.files)
        self.shape: Shape | None = None
        self.model_uri: str | None = None  # the first chunk's `sluice.model` metadata (the worker writes it)
        self._first: Any = None
        self.error: BaseException | None = None
        self.keys: set[str] = set()  # the keys merged, noted when `track` (the table holds keys of several parts)
        self.track = False

    def _matching(self, uri: str, table: Any) -> Any:
        """The chunk's rows of the model asked for (all, when none was); None when it holds none."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.out.model is not None:
            table = table.filter(pc.equal(table[outputs.MODEL].cast(pa.string()), self.out.model))
        return table if table.num_rows else None

    def peek(self) -> Shape | None:
        """The first chunk's shape (None: no rows at all)."""
        for uri, table in self._chunks:
            rows = self._matching(uri, table)
            if rows is not None:
                self.shape, self._first = shape_of(rows, uri), (uri, rows)
                raw = (table.schema.metadata or {}).get(b"sluice.model")
                self.model_uri = raw.decode() if raw else None
                return self.shape
        return None

    def _convert(self, uri: str, rows: Any, target: Shape) -> Any:
        assert self.shape is not None
        got = shape_of(rows, uri)
        if (got.model_id, got.dim) != (self.shape.model_id, self.shape.dim):
            first = self._first[0]
            raise IndexBuildError(
                f"{uri} holds {got.dim}-d rows of model {got.model!r} (model_id {got.model_id}), {first} "
                f"{self.shape.dim}-d rows of model {self.shape.model!r} (model_id {self.shape.model_id}): "
                "one model artifact and preprocessing a table: pick one (--model NAME) or build them into "
                "separate indexes"
            )
        return self._seen(to_index_rows(rows, target, self.out.order, self.out.run_id))

    def _seen(self, rows: Any) -> Any:
        """Note the keys of `rows` when tracked: their older rows are dropped after the merge (whole keys)."""
        if self.track:
            self.keys.update(rows[outputs.KEY].to_pylist())
        return rows

    def batches(self, shape: Shape) -> Iterator[Any]:
        """Every row as record batches of the table's `shape` (an error is kept in .error: Lance raises its own)."""
        try:
            yield from self._seen(to_index_rows(self._first[1], shape, self.out.order, self.out.run_id)).to_batches()
            for uri, table in self._chunks:
                rows = self._matching(uri, table)
                if rows is not None:
                    yield from self._convert(uri, rows, shape).to_batches()
        except Exception as exc:
            self.error = exc
            raise


def _merge(files: Files, index: str, out: RunOutput, report: BuildReport) -> None:
    """Merge one RunOutput into its model's table (created on its first rows)."""
    import pyarrow as pa

    if out.run_id is None:  # Parquet files as they are: no plan vouches for one row a key
        twice = duplicate_key(files, out.files)
        if twice is not None:
            raise IndexBuildError(
                f"{out.label} hold the key {twice} twice: give each key once, or build the sets one after "
                "another, oldest first (a later build replaces a key's row)"
            )
    rows = _Rows(files, out)
    shape = rows.peek()
    if shape is None:
        logger.info("index: no rows", extra={"source": out.label})
        return
    meta = TableMeta.of(shape, out.model_uri or rows.model_uri, out.image_size)
    table = IndexTable.open_or_create(index_table_uri(index, shape.model), meta)
    if outputs.PART not in table.dataset.schema.names:
        raise IndexBuildError(
            f"{table.uri} was built before output rows had parts (key, part, model_id): delete it and build the "
            "index again from its runs"
        )
    tr = _report_for(report, table)
    if out.run_id and out.run_id in table.runs():
        tr.skipped.append(out.run_id)
        return
    target = table.meta.shape  # the table's dtype wins: a lineage may have changed output.dtype
    # A table of one-part keys (images) merges on (key, part 0) alone: only one holding a key of
    # several parts can keep an older part the new rows do not replace.
    rows.track = table.has_parts()
    reader = pa.RecordBatchReader.from_batches(index_schema(target), rows.batches(target))
    started = time.perf_counter()
    try:
        stats = table.merge(reader)
    except Exception:
        if rows.error is not None:
            raise rows.error from None
        raise
    if rows.track:  # keys of several parts: a newer key's rows replace all its older ones
        retry_conflicts(lambda: table.drop_stale_parts(rows.keys, out.order), "drop stale parts")
    if out.run_id:
        retry_conflicts(lambda: table.record_run(out.run_id or ""), "record the run")
    tr.inserted += stats.get("num_inserted_rows", 0)
    tr.updated += stats.get("num_updated_rows", 0)
    tr.merged.append(out.run_id or out.label)
    tr.merge_s += time.perf_counter() - started
    logger.info("index: merged", extra={"source": out.label, "table": table.uri, **stats})


def _report_for(report: BuildReport, table: IndexTable) -> TableReport:
    for t in report.tables:
        if t.uri == table.uri:
            return t
    t = TableReport(table.meta.model, table.meta.model_id, table.uri, table.meta.dim)
    report.tables.append(t)
    return t


def _index(t: TableReport) -> None:
    """Train or extend the table's ANN and key indexes (each retried when another build commits first)."""
    table = IndexTable.open(t.uri)
    assert table is not None  # merged into above
    started = time.perf_counter()
    t.ann = retry_conflicts(lambda: ann.ensure(table.dataset), "the ANN index")
    retry_conflicts(lambda: ann.ensure_key_index(table.dataset), "the key index")
    t.index_s = time.perf_counter() - started
    t.rows = table.count_rows()


def merge_sources(
    sources: Sequence[str], index: str, *, model: str | None = None, files: Files | None = None
) -> BuildReport:
    """Merge `sources` into the index's tables (no ANN work); the report names each table touched."""
    files = files or Files()
    now = datetime.now(UTC).isoformat(timespec="microseconds")
    outputs = resolve(sources, files, model=model, now=now)
    report = BuildReport(index)
    for out in reversed(outputs):  # oldest first: the lineage, then the run (any order gives the same rows)
        retry_conflicts(partial(_merge, files, index, out, report), f"merge {out.label}")
    if not report.tables:
        given = ", ".join(sources)
        raise EmptySource(
            f"no committed output rows in {given}"
            + (f" for model {model!r}" if model else "")
            + ": nothing to index, no index written (a chunk counts only with its commit marker)"
        )
    return report


def build(sources: Sequence[str], index: str, *, model: str | None = None, files: Files | None = None) -> BuildReport:
    """Build or update the index at `index` (a folder: local or s3://) from `sources`."""
    started = time.perf_counter()
    index = index if index.endswith("/") else index + "/"
    report = merge_sources(sources, index, model=model, files=files)
    for t in report.tables:
        _index(t)
    report.seconds = time.perf_counter() - started
    return report
