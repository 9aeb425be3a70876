"""What a build reads: SOURCE arguments -> each run's committed Parquet chunks, per model.

A SOURCE is one of:
    a run's root (holds plan.json: runs/<run>/ on S3, DIR/<run>/ of `sluice local run --out`),
    or its output prefix (<root>/output/): every model of the run, and the runs of its
    lineage (input.since_run) that the index does not hold yet;
    an output prefix without a plan: its chunks, the rows' model read from the rows;
    Parquet files in Sluice's output schema, taken as they are.

On a prefix a chunk counts only with its commit marker (gpu_worker/output/commits.py: a chunk without
one is a killed attempt's leftover). A local copy (`sluice local run --out`, marked by
paths.LOCAL_COPY_MARKER) holds committed chunks only and no markers. The model folders of a
run with several models come from the plan (RunPlan.model_output_prefix), never from a
folder name written here.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from sluice.contracts.plan import RunPlan
from sluice.errors import SluiceError
from sluice.index.storage import Files, is_s3
from sluice.paths import COMMITS_DIR, LOCAL_COPY_MARKER, RunPaths, committed_chunk, is_commit_marker, join

MARKER_READERS = 32  # concurrent commit-marker GETs (S3 serves 5,500 GET/s per prefix)


class IndexBuildError(SluiceError):
    """A build that cannot go ahead; the message names the file, model or field, and what to do."""


@dataclass(frozen=True)
class RunOutput:
    """One run's chunks for one model (or a set of Parquet files): what one merge commits."""

    label: str  # names it in messages and the report: the run id, or the SOURCE as given
    files: tuple[str, ...]
    order: str  # the rows' precedence: newer wins (the plan's created_at, else the build's start)
    model: str | None  # the model's name; None: the rows' own (Parquet files, prefixes without a plan)
    run_id: str | None = None  # set when a plan names the run: a table that holds it skips it
    lineage: bool = False  # an earlier run of the lineage, read because the SOURCE's run completes it
    model_uri: str | None = None  # the plan's model uri and input side (what search embeds queries with)
    image_size: int | None = None


def _iso(text: str, default: str) -> str:
    """`text` when it is an ISO timestamp (a plan's created_at: not one written by hand, nor "standalone")."""
    try:
        datetime.fromisoformat(text)
    except ValueError:
        return default
    return text


def committed_files(files: Files, prefix: str, *, markers: bool = True) -> list[str]:
    """The Parquet chunks under `prefix` that count: with their commit marker (or all, for a local copy)."""
    entries = [e.uri for e in files.walk(prefix)]
    parquet = {u for u in entries if u.endswith(".parquet") and f"/{COMMITS_DIR}" not in u}
    if not markers:
        return sorted(parquet)

    def named(marker: str) -> str | None:
        try:
            doc = json.loads(files.read(marker))
        except (OSError, ValueError) as exc:
            raise IndexBuildError(f"commit marker {marker} cannot be read: {exc}") from None
        name = doc.get("file") if isinstance(doc, dict) else None
        return committed_chunk(marker, name) if isinstance(name, str) and name else None

    marker_uris = [u for u in entries if is_commit_marker(u)]
    with ThreadPoolExecutor(MARKER_READERS) as pool:
        chunks = {c for c in pool.map(named, marker_uris) if c}
    missing = sorted(chunks - parquet)
    if missing:
        raise IndexBuildError(
            f"commit marker names {missing[0]}, which is missing ({len(missing)} such chunk(s)): the output "
            "was changed after the run; rerun the run's failed shards or index another run"
        )
    return sorted(chunks)


@dataclass(frozen=True)
class _Run:
    """A run's root with its plan, where its output is read from."""

    root: str
    plan: RunPlan
    local_copy: bool  # a `sluice local run --out` folder: output/ holds committed chunks only, no markers

    def model_prefix(self, i: int) -> str:
        prefix = self.plan.model_output_prefix(i)
        if not self.local_copy:
            return prefix
        return join(self.root, "output/") + prefix[len(self.plan.output_prefix) :]


def _read_run(files: Files, root: str) -> _Run | None:
    """The run whose root is `root`, or None when `root` holds no plan.json."""
    root = root if root.endswith("/") else root + "/"
    plan_uri = join(root, "plan.json")
    if not files.exists(plan_uri):
        return None
    try:
        plan = RunPlan.model_validate_json(files.read(plan_uri))
    except ValidationError as exc:
        raise IndexBuildError(f"{plan_uri} is not a Sluice plan: {exc.errors()[0].get('msg')}") from None
    return _Run(root, plan, local_copy=not is_s3(root) and files.exists(join(root, LOCAL_COPY_MARKER)))


def _run_at(files: Files, source: str) -> _Run | None:
    """The run a prefix SOURCE names: its root, or its default output prefix (<root>/output/)."""
    run = _read_run(files, source)
    if run is not None:
        return run
    trimmed = source.rstrip("/")
    if posixpath.basename(trimmed) == "output":
        return _read_run(files, posixpath.dirname(trimmed) + "/")
    return None


def _earlier_root(run: _Run, run_id: str) -> str:
    """Where an earlier run of the lineage lives: beside a local run folder, else in the control bucket."""
    if not is_s3(run.root):
        return join(posixpath.dirname(run.root.rstrip("/")) + "/", run_id + "/")
    return RunPaths.in_bucket(run.plan.control_bucket, run_id).root


def _model_indexes(plan: RunPlan, model: str | None, label: str) -> list[int]:
    if model is None:
        return list(range(len(plan.models)))
    names = [m.name for m in plan.models]
    if model not in names:
        raise IndexBuildError(f"{label}: run {plan.run_id} has no model {model!r} (its models: {', '.join(names)})")
    return [names.index(model)]


def _run_outputs(files: Files, run: _Run, model: str | None, now: str, *, lineage: bool) -> list[RunOutput]:
    plan = run.plan
    out = []
    for i in _model_indexes(plan, model, run.root):
        chunks = committed_files(files, run.model_prefix(i), markers=not run.local_copy)
        out.append(
            RunOutput(
                label=plan.run_id,
                files=tuple(chunks),
                order=_iso(plan.created_at, now),
                model=plan.models[i].name,
                run_id=plan.run_id,
                lineage=lineage,
                model_uri=plan.models[i].uri,
                image_size=plan.models[i].image_size,
            )
        )
    return out


def _with_lineage(files: Files, run: _Run, model: str | None, now: str) -> list[RunOutput]:
    """The run's outputs, then its lineage's (newest first); an earlier run missing locally is left out."""
    out = _run_outputs(files, run, model, now, lineage=False)
    for run_id in run.plan.lineage:
        earlier = _read_run(files, _earlier_root(run, run_id))
        if earlier is None:
            if not is_s3(run.root):
                continue  # a local folder may hold this run only
            raise IndexBuildError(
                f"run {run.plan.run_id} completes run {run_id} (input.since_run), whose plan is missing "
                f"at {_earlier_root(run, run_id)}: its rows cannot be indexed"
            )
        out += _run_outputs(files, earlier, model, now, lineage=True)
    return out


def resolve(sources: Sequence[str], files: Files, *, model: str | None, now: str) -> list[RunOutput]:
    """Every SOURCE as what its merges read, newest first as given (Parquet files given form one set)."""
    out: list[RunOutput] = []
    loose: list[str] = []
    for source in sources:
        if source.endswith(".parquet"):
            if not files.exists(source):
                raise IndexBuildError(f"{source}: no such Parquet file")
            loose.append(source)
            continue
        if not files.is_dir(source):
            raise IndexBuildError(
                f"{source}: nothing there: give a run's folder or output prefix (local or s3://), or Parquet files"
            )
        run = _run_at(files, source)
        if run is not None:
            out += _with_lineage(files, run, model, now)
        else:
            prefix = source if source.endswith("/") else source + "/"
            local_copy = not is_s3(prefix) and files.exists(join(prefix, LOCAL_COPY_MARKER))
            out.append(RunOutput(source, tuple(committed_files(files, prefix, markers=not local_copy)), now, model))
    if loose:
        label = loose[0] if len(loose) == 1 else f"{len(loose)} Parquet files"
        out.append(RunOutput(label, tuple(loose), now, model))
    return out
