"""The read recipe: a run and its lineage as one complete, duplicate-free set of embeddings (duckdb SQL).

Rows of every run of the lineage for this run's models (model_id), newest run first per
(key, model_id), a key whole: every part (text chunk, video frame) of that run's version of
it, none of an older run's (sluice.outputs). The row an incremental run left in place is, by its skip rule
(sluice.incremental), one of the key's current version. On S3 a Parquet chunk counts only
with its commit marker (gpu_worker/output/commits.py: a chunk without one is a killed attempt's
leftover); a local copy (`sluice local run --out`) holds committed chunks only.
`sluice output sql RUN` prints it (docs/incremental.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.aws.s3uri import parse_s3_uri
from sluice.aws.store import ObjectStore
from sluice.contracts.plan import RunPlan
from sluice.errors import SluiceError
from sluice.paths import MODEL_DIR_KEY, RunPaths


@dataclass(frozen=True)
class Source:
    """One run's output as the recipe reads it."""

    run_id: str
    output_prefix: str  # s3://... (or a local folder) ending in "/"
    multi_model: bool  # output_prefix/model_name=<name>/shard=<i>/ rather than output_prefix/shard=<i>/

    @property
    def _models(self) -> str:
        return f"{MODEL_DIR_KEY}=*/" if self.multi_model else ""

    @property
    def parquet_glob(self) -> str:
        return self.output_prefix + self._models + "shard=*/part-*.parquet"

    @property
    def marker_glob(self) -> str:
        return self.output_prefix + self._models + "shard=*/_commits/*.json"

    @classmethod
    def of(cls, plan: RunPlan, output_prefix: str | None = None) -> Source:
        """The run of `plan`, its output at `output_prefix` (default: the plan's own, on S3)."""
        return cls(plan.run_id, output_prefix or plan.output_prefix, plan.multi_model)


def _q(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _list(items: Sequence[str]) -> str:
    return "[" + ", ".join(_q(i) for i in items) + "]"


_COMMITTED = """committed AS (  -- a chunk counts only with its commit marker: others are killed attempts' leftovers
    SELECT regexp_replace(filename, '_commits/[^/]*$', '') || file AS filename
    FROM read_json({markers}, columns = {{'file': 'VARCHAR'}}, filename = true)
    WHERE file IS NOT NULL
),
"""
_RECIPE = """-- The embeddings of run {run} and the runs it completes, newest first ({names}):
-- the rows of each (key, model_id) (one a part: part, part_start, part_end) from the newest run that
-- embedded the key with that model_id (output from before parts: part NULL, an image).
WITH lineage(run, rank) AS (VALUES {ranks}),
{committed}rows AS (
    SELECT o.*, lineage.rank
    FROM read_parquet({files}, filename = true, hive_partitioning = false, union_by_name = true) o
    JOIN lineage USING (run)
    WHERE o.model_id IN ({model_ids}){where_committed}
)
SELECT * EXCLUDE (filename, rank) FROM rows
QUALIFY rank = min(rank) OVER (PARTITION BY key, model_id)"""


def recipe_sql(sources: Sequence[Source], model_ids: Sequence[str], *, markers: bool = True) -> str:
    """The query: `sources` newest first (the run, then its lineage), rows of `model_ids` only.

    `markers`: read only chunks with a commit marker (output as the workers left it on S3); off
    for a local copy that holds committed chunks only. duckdb refuses a glob that matches no
    file, so leave out runs without output (sluice output sql checks). Every value is a quoted
    literal (_q); run ids match models.RUN_ID, so the comment lines hold no newline.
    """
    if not sources:
        raise ValueError("no run with output to read")
    return _RECIPE.format(
        run=sources[0].run_id,
        names=", ".join(s.run_id for s in sources),
        ranks=", ".join(f"({_q(s.run_id)}, {i})" for i, s in enumerate(sources)),
        committed=_COMMITTED.format(markers=_list([s.marker_glob for s in sources])) if markers else "",
        files=_list([s.parquet_glob for s in sources]),
        model_ids=", ".join(_q(m) for m in dict.fromkeys(model_ids)),
        where_committed="\n      AND o.filename IN (SELECT filename FROM committed)" if markers else "",
    )


def lineage_sources(
    plan: RunPlan, read_plan: Callable[[str], RunPlan], has_output: Callable[[Source], bool], root: str | None = None
) -> list[Source]:
    """The run of `plan` and its lineage as sources, newest first, those without output left out.

    `root`: a local copy's folder (`sluice local run --out DIR`): run r's output is DIR/r/output/.
    """
    plans = [plan, *(read_plan(r) for r in plan.lineage)]
    sources = [Source.of(p, None if root is None else f"{root.rstrip('/')}/{p.run_id}/output/") for p in plans]
    return [s for s in sources if has_output(s)]


def sql_for_run(run_id: str, *, bucket: str | None = None, s3: Any = None, local: str | None = None) -> str:
    """`sluice output sql RUN`: the recipe for a run in the control bucket `bucket`, or in a local copy `local`."""
    if local is not None:
        base = Path(local)

        def read_local(r: str) -> RunPlan:
            return RunPlan.model_validate_json((base / r / "plan.json").read_bytes())

        def local_output(src: Source) -> bool:
            return any(Path(src.output_prefix).rglob("part-*.parquet"))

        plan = read_local(run_id)
        return recipe_sql(
            lineage_sources(plan, read_local, local_output, str(base)), [m.model_id for m in plan.models], markers=False
        )
    if bucket is None:
        raise SluiceError("sluice output sql: give the control bucket (--bucket or SLUICE_CONTROL_BUCKET), or --local")

    def read_s3(r: str) -> RunPlan:
        return RunPlan.model_validate_json(ObjectStore(s3).get(RunPaths.in_bucket(bucket, r).plan))

    def s3_output(src: Source) -> bool:
        b, prefix = parse_s3_uri(src.output_prefix, allow_empty_key=True)
        return bool(s3.list_objects_v2(Bucket=b, Prefix=prefix, MaxKeys=1).get("KeyCount"))

    plan = read_s3(run_id)
    return recipe_sql(lineage_sources(plan, read_s3, s3_output), [m.model_id for m in plan.models])
