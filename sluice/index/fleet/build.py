"""The distributed index build: train once, index fragments in N children, commit the segments once.

    train    merge the sources into the tables (sluice.index.build), then per table the one ANN
             decision (ann.plan_for): no index, extend the trained lists in place (children have
             nothing to do), or train IVF centroids and the PQ codebook on a sample (ann's
             parameters; on a CUDA GPU when torch sees one) and deal the fragments to N children
             (sluice.index.fleet.deal). Writes the FleetPlan (sluice.contracts) and the models.
    segment  child k: create_index_uncommitted on its fragments with the trained models, one
             segment a table under a deterministic uuid (a retried child overwrites its own), and
             its FleetChild file.
    commit   every child's segments -> commit_existing_index_segments (one v2 IVF_PQ index, the
             same as the single build's: optimize_indices extends it later), merged into one
             segment, the trained parameters in the table's config, the key index.

Work files live under <index>/_fleet/<run>/ (sluice.paths.fleet_path). Each step is idempotent:
train reuses a plan whose tables are still at its versions, commit skips segments it committed (sluice.ann).
"""

from __future__ import annotations

import importlib.util
import os
import resource
import time
from typing import Any

from sluice.index import ann
from sluice.index.build import BuildReport, TableReport, merge_sources
from sluice.index.fleet.deal import deal, fragment_rows, split_fragments
from sluice.index.fleet.files import (
    FleetChild,
    FleetMode,
    FleetPlan,
    FleetTable,
    model_uri,
    plan_uri,
    read_array,
    read_child,
    read_plan,
    segment_uuid,
    to_doc,
    to_index,
    write_array,
    write_child,
)
from sluice.index.sources import IndexBuildError
from sluice.index.storage import Files, storage_options
from sluice.index.table import IndexTable, retry_conflicts
from sluice.log import logger

PQ_CODES = 256  # 8-bit PQ codes: centroids a sub-vector
NVIDIA_DRIVER = "/proc/driver/nvidia/version"  # present where an NVIDIA driver is loaded


def accelerator(torch: Any | None = None) -> str | None:
    """The k-means device: "cuda" when torch is importable and sees a CUDA device, else None (the CPU).

    Without an NVIDIA driver torch is not imported at all (its import costs seconds and ~0.5 GB).
    """
    if torch is None:
        if importlib.util.find_spec("torch") is None or not os.path.exists(NVIDIA_DRIVER):
            return None
        # The index job's code (it needs lance and numpy too), never a Lambda's: no handler's import
        # closure reaches sluice.index, and no Lambda artifact holds torch (.ci/check_lambda_artifact.py).
        import torch as imported

        torch = imported
    return "cuda" if torch.cuda.is_available() else None


def peak_rss_mb() -> float:
    """This process's peak RSS (VmHWM: ru_maxrss would count a spawning parent's, kept across exec)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _current(files: Files, index: str, run_id: str) -> FleetPlan | None:
    """A plan this run's train wrote before whose tables nothing has changed since (a rerun: the same plan)."""
    if not files.exists(plan_uri(index, run_id)):
        return None
    plan = read_plan(files, index, run_id)
    for t in plan.tables:
        table = IndexTable.open(t.uri)
        if table is None or table.dataset.version != t.version:
            return None
    return plan


def train(
    sources: list[str], index: str, run_id: str, children: int, *, model: str | None = None, files: Files | None = None
) -> FleetPlan:
    """Merge, decide and train each table; write and return the FleetPlan for `children` children."""
    started = time.time()
    files = files or Files()
    index = index if index.endswith("/") else index + "/"
    reused = _current(files, index, run_id)
    if reused is not None and reused.children == children:
        return reused
    report = merge_sources(sources, index, model=model, files=files)
    accel = accelerator()
    tables = [_timed_plan(t, index, run_id, children, files, accel) for t in report.tables]
    plan = FleetPlan(
        run_id=run_id, index_uri=index, children=children, started_at=started, accelerator=accel, tables=tables
    )
    files.write(plan_uri(index, run_id), plan.model_dump_json().encode())
    logger.info("index fleet: planned", extra={"run_id": run_id, "children": children, "s": time.time() - started})
    return plan


def _timed_plan(t: TableReport, index: str, run_id: str, children: int, files: Files, accel: str | None) -> FleetTable:
    """_plan_table, with the table's merge and train seconds (the report's merge_s and index_s add them up)."""
    started = time.perf_counter()
    planned = _plan_table(t, index, run_id, children, files, accel)
    return planned.model_copy(update={"merge_s": t.merge_s, "train_s": time.perf_counter() - started})


def _plan_table(t: TableReport, index: str, run_id: str, children: int, files: Files, accel: str | None) -> FleetTable:
    """One table's part of the plan: none, extended in place, or trained and dealt."""
    table = IndexTable.open(t.uri)
    assert table is not None  # merged into just now
    decided = ann.plan_for(table.dataset)
    base: dict[str, Any] = dict(
        model=t.model, model_id=t.model_id, uri=t.uri, dim=t.dim, rows=decided.rows, index_name=decided.name
    )
    base |= dict(merged=t.merged, skipped=t.skipped, inserted=t.inserted, updated=t.updated)
    if decided.action != "train":
        if decided.action == "extend":
            retry_conflicts(
                lambda: table.dataset.optimize.optimize_indices(index_names=[decided.name]), "extend the ANN index"
            )
        mode: FleetMode = "none" if decided.action == ann.NONE else "extended"
        return FleetTable(version=table.dataset.version, mode=mode, **base)
    assert decided.params is not None
    bound = fragment_rows(decided.rows, children)
    ds = retry_conflicts(lambda: split_fragments(table.dataset, bound), "split the fragments")
    ivf, pq = _train_models(ds, decided.params, accel)
    ivf_at, pq_at = model_uri(index, run_id, t.model, "ivf"), model_uri(index, run_id, t.model, "pq")
    write_array(files, ivf_at, ivf.centroids)
    write_array(files, pq_at, pq.codebook)
    shares = deal([(f.fragment_id, f.count_rows()) for f in ds.get_fragments()], children)
    p = decided.params
    return FleetTable(
        version=ds.version, mode="segments", num_partitions=p.num_partitions, num_sub_vectors=p.num_sub_vectors,
        ivf=ivf_at, pq=pq_at, shares=shares, **base,
    )  # fmt: skip


def _train_models(ds: Any, params: ann.AnnParams, accel: str | None) -> tuple[Any, Any]:
    """IVF centroids and the PQ codebook on a sample, with the single build's k-means settings."""
    from lance.indices import IndicesBuilder

    builder = IndicesBuilder(ds, ann.COLUMN)
    rows = int(ds.count_rows())
    # Lance's trainers want lists x sample_rate rows (IVF) and 256 x sample_rate (PQ: 8-bit codes); a small
    # table (SLUICE_INDEX_MIN_ANN_ROWS lowered) samples the rows it has, as create_index does.
    ivf = builder.train_ivf(
        params.num_partitions,
        distance_type=ann.METRIC,
        accelerator=accel,
        sample_rate=max(2, min(ann.SAMPLE_RATE, rows // params.num_partitions)),
        max_iters=ann.KMEANS_ITERS,
    )
    pq_rate = max(2, min(ann.SAMPLE_RATE, rows // PQ_CODES))  # Lance refuses 1
    pq = builder.train_pq(ivf, params.num_sub_vectors, sample_rate=pq_rate, max_iters=ann.KMEANS_ITERS)
    return ivf, pq


def segment(plan: FleetPlan, child: int, files: Files | None = None) -> FleetChild:
    """Child `child`: a segment of each table it has fragments of; its FleetChild file (empty: nothing to do)."""
    import lance

    if not 0 <= child < plan.children:
        raise IndexBuildError(f"child {child} is not one of the plan's {plan.children} (0..{plan.children - 1})")
    started = time.perf_counter()
    files = files or Files()
    result = FleetChild(run_id=plan.run_id, child=child, children=plan.children)
    for t in plan.tables:
        share = t.shares[child] if t.mode == "segments" else []
        if not share:
            continue
        assert t.ivf is not None and t.pq is not None
        ds = lance.dataset(t.uri, version=t.version, storage_options=storage_options(t.uri))
        idx = ds.create_index_uncommitted(
            ann.COLUMN, ann.KIND, name=t.index_name, metric=ann.METRIC, replace=True,
            num_partitions=t.num_partitions, num_sub_vectors=t.num_sub_vectors,
            ivf_centroids=read_array(files, t.ivf), pq_codebook=read_array(files, t.pq),
            fragment_ids=share, index_uuid=segment_uuid(plan.run_id, t, child),
        )  # fmt: skip
        result.segments.append(to_doc(idx, t.uri))
        result.rows += sum(int(f.count_rows()) for f in ds.get_fragments() if f.fragment_id in set(share))
    result.seconds = round(time.perf_counter() - started, 3)
    result.peak_rss_mb = round(peak_rss_mb(), 1)
    write_child(files, plan.index_uri, result)
    return result


def commit(plan: FleetPlan, files: Files | None = None) -> BuildReport:
    """Every child's segments committed as each table's index, then the key index; the build's report."""
    files = files or Files()
    children = [read_child(files, plan.index_uri, plan.run_id, k) for k in range(plan.children)]
    report = BuildReport(plan.index_uri)
    report.children = [c.model_dump(exclude={"segments", "run_id"}) for c in children if c is not None]
    for t in plan.tables:
        started = time.perf_counter()
        table = IndexTable.open(t.uri)
        if table is None:
            raise IndexBuildError(f"{t.uri}: the table train merged into is gone: run the stages again from train")
        if t.mode == "segments":
            _commit_segments(table, t, children)
        retry_conflicts(lambda t=table: ann.ensure_key_index(t.dataset), "the key index")  # type: ignore[misc]
        kind = ann.NONE if t.mode == "none" else ann.KIND
        report.tables.append(
            TableReport(t.model, t.model_id, t.uri, t.dim, table.count_rows(), t.inserted, t.updated, kind, t.merged)
        )
        report.tables[-1].skipped, report.tables[-1].merge_s = t.skipped, t.merge_s
        # index_s: train's ANN work, the segment stage (its slowest child with a segment of the table), commit's
        built = [c.seconds for c in children if c is not None and any(s.table == t.uri for s in c.segments)]
        report.tables[-1].index_s = t.train_s + max(built, default=0.0) + time.perf_counter() - started
    report.seconds = time.time() - plan.started_at
    return report


def _commit_segments(table: IndexTable, t: FleetTable, children: list[FleetChild | None]) -> None:
    """Check every child's segment of the table is there and covers its share, then commit them as one index."""
    segments = []
    for k, share in enumerate(t.shares):
        if not share:
            continue
        child = children[k]
        mine = [s for s in child.segments if s.table == t.uri] if child is not None else []
        if [f for s in mine for f in s.fragment_ids] != share:
            raise IndexBuildError(
                f"{t.uri}: segment child {k} of {len(t.shares)} has not indexed its fragments {share}: run that "
                "child again (its stage is idempotent), then commit"
            )
        segments.extend(mine)
    uuids = sorted(s.uuid for s in segments)
    if ann.trained(table.dataset).get("segments") == uuids:
        return  # a rerun of commit: these segments are the index already (merged into one since)
    retry_conflicts(
        lambda: table.dataset.commit_existing_index_segments(t.index_name, ann.COLUMN, [to_index(s) for s in segments]),
        "commit the ANN segments",
    )
    # One index, as the single build's: a search probes each segment's lists separately (measured: 2
    # segments, p50 1.4-1.7x the single build's), so the segments are merged into one (a pass over their codes).
    retry_conflicts(
        lambda: table.dataset.optimize.optimize_indices(index_names=[t.index_name], num_indices_to_merge=len(segments)),
        "merge the ANN segments",
    )
    assert t.num_partitions is not None and t.num_sub_vectors is not None
    params = ann.AnnParams(t.num_partitions, t.num_sub_vectors)
    ann.record(table.dataset, ann.AnnPlan("train", t.index_name, t.rows, params), segments=uuids)
