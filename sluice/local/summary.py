"""A local run's end: its summary (from the bus, the ledger and failures/), its output copied to DIR/<run id>/."""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts.events import RunFailed, RunSucceeded, parse_detail
from sluice.contracts.results import FailureLine
from sluice.contracts.sections import KIND_WORDS
from sluice.contracts.status import RunStatus
from sluice.control.table.items import RunItem, main_passes
from sluice.local.emulator.bus import BusTap
from sluice.paths import COMMITS_DIR, RunPaths, is_commit_marker

SUMMARY_FILE = "summary.json"  # the summary, in the run's folder too (a closed terminal pipe loses stdout)

# How a stalled attempt was found (StalledAttempt.cause).
_STILL = {"no_beat": "without a first progress beat", "no_progress": "without progress", None: "without progress"}


@dataclass(frozen=True)
class Ended:
    """A run that ended, and where it ran: what its summary is built from."""

    row: RunItem
    seconds: float
    endpoint: str
    run_dir: Path


def summarize(c: Any, tap: BusTap, run: Ended) -> dict[str, Any]:
    """The run's summary (its own events only, from its tap); copies its output, failures and plan.json to run_dir."""
    row = run.row
    events = tap.events(c, row.run_id)
    details = [parse_detail(e["detail-type"], e["detail"]) for e in events]
    final = next((d for d in details if isinstance(d, RunSucceeded | RunFailed)), None)
    processed = final.processed if final else (row.processed or 0)
    outcomes = {RunStatus.SUCCEEDED: "succeeded", RunStatus.FAILED: "failed"}
    out = {
        "run_id": row.run_id,
        "outcome": outcomes.get(row.status, row.status.value),
        "processed": processed,
        "failed": final.failed if final else (row.failed_keys or 0),
        "failed_by_reason": _failure_reasons(c, row),
        "reason": final.reason if isinstance(final, RunFailed) else None,
        "reasons": row.reasons or [],
        "shards": int(row.shards or 0),
        "retry_passes": max(1, len(main_passes(row.passes))) - 1,
        "splits": final.splits if final else 0,  # the tail: slow shards' remaining keys split off
        "split_keys": final.split_keys if final else 0,
        "wall_s": round(run.seconds, 1),
        "images_per_s": rate(processed, run.seconds),
        "output_prefix": row.output_prefix,
        "events": [e["detail-type"] for e in events],
        "endpoint": run.endpoint,
        "logs": str(run.run_dir / "logs"),
        "prepare": _prepare_summary(c, row),
        "lineage": row.lineage or [],
        "skipped": row.skipped or {},
    }
    out["output_dir"] = _copy_output(c, row, run.run_dir)
    out["failures_dir"] = str(run.run_dir / "failures")
    out["models"] = _models(run.run_dir)
    out.update(_kind(run.run_dir, processed, run.seconds))
    out["damaged"] = _damaged(run.run_dir / "logs")
    if out["kind"] != "image":  # images/s of a text run misleads: its rate is documents/s (per_s)
        del out["images_per_s"]
    out.update(_index(c, row, run.run_dir))
    return out


def _damaged(logs: Path) -> list[dict[str, str]]:
    """Objects kept in part (a video broken part way): key and where it broke, from the workers' log lines."""
    found: dict[str, str] = {}
    for log in sorted(logs.glob("*.log")) if logs.is_dir() else []:
        for line in log.read_text(errors="replace").splitlines():
            if '"object partly damaged' not in line:
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            found.setdefault(str(rec.get("key")), str(rec.get("note", "")))
    return [{"key": k, "note": n} for k, n in sorted(found.items())]


def rate(n: float, seconds: float) -> float:
    """n a second, to a precision that says something: 0.1 from 10/s up, else three significant digits.

    3 documents in 78.6 s are 0.0382/s, not 0.0; 13.5 images/s stay 13.5.
    """
    if not seconds or not n:
        return 0.0
    r = n / seconds
    return round(r, 1) if r >= 10 else round(r, 2 - math.floor(math.log10(r)))


def _kind(run_dir: Path, processed: int, seconds: float) -> dict[str, Any]:
    """What the run embedded, in its own words: objects a second, and the parts (chunks, frames) they became."""
    from sluice.contracts.plan import RunPlan

    plan = run_dir / "plan.json"
    kind = RunPlan.model_validate_json(plan.read_bytes()).content.kind if plan.exists() else "image"
    out: dict[str, Any] = {"kind": kind, "per_s": rate(processed, seconds)}
    if KIND_WORDS[kind][1]:
        import pyarrow.parquet as pq

        files = _first_model_files(run_dir)  # each model writes every object (an audio model its own windows)
        out["parts"] = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        out["parts_per_s"] = rate(out["parts"], seconds)
    if kind == "audio":
        out["audio_s"] = _audio_seconds(run_dir)
        out["audio_s_per_s"] = rate(out["audio_s"], seconds)
    return out


def _first_model_files(run_dir: Path) -> list[Path]:
    """The Parquet files of the run's first model (with several, each has its own model_name= folder)."""
    models = _models(run_dir)
    out = run_dir / "output"
    return sorted(out.glob(f"model_name={models[0]}/**/*.parquet") if len(models) > 1 else out.rglob("*.parquet"))


def _audio_seconds(run_dir: Path) -> float:
    """Seconds of audio embedded: each file's last window's end (part_end), from the first model's rows."""
    import pyarrow.parquet as pq

    ends: dict[str, float] = {}
    for f in _first_model_files(run_dir):
        cols = pq.read_table(f, columns=["key", "part_end"]).to_pydict()
        for key, end in zip(cols["key"], cols["part_end"]):
            ends[key] = max(ends.get(key, 0.0), float(end))
    return round(sum(ends.values()), 1)


def _index(c: Any, row: RunItem, run_dir: Path) -> dict[str, Any]:
    """The index stage's end: the index copied to DIR/<run id>/index/, a path `sluice search` takes."""
    ix = row.index
    if ix is None:
        return {"index": None}  # output.index is off
    if ix.state != "indexed":
        return {"index": None, "index_error": ix.reason or f"the index stage did not finish ({ix.state})"}
    bucket, prefix = parse_s3_uri(ix.uri, allow_empty_key=True)
    dest = run_dir / "index"
    for page in c.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            target = dest / o["Key"][len(prefix) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(c.s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())
    return {"index": str(dest), "index_uri": ix.uri, "index_rows": ix.rows, "index_ann": ix.ann}


def _models(run_dir: Path) -> list[str]:
    """The run's model names, from the plan.json copied into its folder."""
    from sluice.contracts.plan import RunPlan

    plan = run_dir / "plan.json"
    return [m.name for m in RunPlan.model_validate_json(plan.read_bytes()).models] if plan.exists() else []


def _prepare_summary(c: Any, row: RunItem) -> dict[str, Any] | None:
    """What the prepare stage did (None when the manifest Lambda planned the run itself)."""
    if row.prepare is None:
        return None
    from sluice.aws.store import ObjectStore
    from sluice.contracts.prepare import PrepareSpec
    from sluice.prepare import prepare_store
    from sluice.prepare.collect import collect

    spec = PrepareSpec.model_validate_json(ObjectStore(c.s3).get(row.prepare.spec_uri))
    return collect(spec, prepare_store(c.s3)).summary(spec)


def _failures_prefix(row: RunItem) -> tuple[str, str]:
    """(bucket, key prefix) of the run's failures/, under the control bucket that holds its plan."""
    bucket, _ = parse_s3_uri(str(row.plan_uri))
    return parse_s3_uri(RunPaths.in_bucket(bucket, row.run_id).failures_prefix)


def _failure_reasons(c: Any, row: RunItem) -> dict[str, int]:
    """Reasons of the keys that finally failed (last record per key)."""
    if not row.plan_uri:
        return {}
    bucket, prefix = _failures_prefix(row)
    pages = c.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    objects = [o for page in pages for o in page.get("Contents", [])]
    last: dict[str, str] = {}
    for o in sorted(objects, key=lambda o: int(o["Key"].rsplit("/", 1)[-1].split(".")[0])):
        for line in c.s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].iter_lines():
            if line.strip():
                failure = FailureLine.model_validate_json(line)
                last[failure.key] = failure.reason.value
    return dict(Counter(last.values()))


def _copy_output(c: Any, row: RunItem, dest: Path) -> str | None:
    """Copy committed Parquet output, failures and plan.json into the run's own folder (OUT/<run id>/).

    A chunk without its commit marker (a killed attempt's leftover) is left out, and the markers
    too: the copy is the run's valid output only (`sluice output sql RUN --local OUT` reads it).
    """
    if not row.output_prefix:
        return None
    bucket, prefix = parse_s3_uri(row.output_prefix, allow_empty_key=True)
    ctl, failures = _failures_prefix(row)
    for b, p, sub in ((bucket, prefix, "output"), (ctl, failures, "failures")):
        keys = [
            o["Key"]
            for page in c.s3.get_paginator("list_objects_v2").paginate(Bucket=b, Prefix=p)
            for o in page.get("Contents", [])
        ]
        marked = {k.replace(COMMITS_DIR, "").removesuffix(".json") + ".parquet" for k in keys if is_commit_marker(k)}
        for key in keys:
            if is_commit_marker(key) or (key.endswith(".parquet") and key not in marked):
                continue
            target = dest / sub / key[len(p) :]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(c.s3.get_object(Bucket=b, Key=key)["Body"].read())
    if row.plan_uri:
        pb, pk = parse_s3_uri(row.plan_uri)
        (dest / "plan.json").write_bytes(c.s3.get_object(Bucket=pb, Key=pk)["Body"].read())
    return str(dest)


def save(run_dir: Path, s: dict[str, Any]) -> None:
    """The summary as DIR/<run id>/summary.json."""
    (run_dir / SUMMARY_FILE).write_text(json.dumps(s, indent=2) + "\n")


def stopped_work(executor: Any, concluded: bool) -> str | None:
    """What an interrupt stops: the index stage (the run `concluded`) or the run's workers, and their logs
    on disk (None: no worker was running)."""
    tasks = [t for job in executor.jobs.values() for t in job.tasks if t.proc is not None and t.proc.poll() is None]
    if not tasks:
        return None
    what = "the index stage" if concluded else "the run"
    logs = ", ".join(t.log_path for t in tasks[:3]) + (f" and {len(tasks) - 3} more" if len(tasks) > 3 else "")
    return f"{what} ({len(tasks)} worker(s) stopped); log: {logs}"


def report(s: dict[str, Any], as_json: bool) -> None:
    """The summary on stdout: one JSON object, or a table."""
    if as_json:
        print(json.dumps(s, indent=2))
        return
    rows = [("run id", s.get("run_id")), ("outcome", s.get("outcome"))]
    if s.get("interrupted"):  # Ctrl-C: what it stopped, and where that work's log is
        rows.append(("interrupted", s.get("interrupted_work") or "before any worker started"))
    rows += [("reason", r) for r in s.get("reasons") or []]
    if "processed" in s:
        rows += _ran_rows(s)
    width = max(len(k) for k, _ in rows)
    sys.stdout.write("\nSluice local run\n" + "".join(f"  {k:<{width}}  {v}\n" for k, v in rows))


def _rate_row(s: dict[str, Any]) -> tuple[str, Any]:
    """images/s; documents/s with chunks/s; videos/s with frames/s; audio files/s with windows/s and seconds."""
    noun, part = KIND_WORDS[s.get("kind", "image")]
    rate = s.get("per_s", s.get("images_per_s"))
    if not part:
        return f"{noun}/s", rate
    audio = f"; {s['audio_s']:g} s of audio, {s.get('audio_s_per_s')} s/s" if "audio_s" in s else ""
    return f"{noun}/s", f"{rate}  ({s.get('parts')} {part}, {s.get('parts_per_s')} {part}/s{audio})"


def _splits(s: dict[str, Any]) -> str | None:
    """The tail's row: slow shards whose remaining keys were split off (none: no row)."""
    return f"{s['splits']} slow shard(s): {s['split_keys']} keys split off to new shards" if s.get("splits") else None


def _stalled_rows(s: dict[str, Any]) -> list[tuple[str, Any]]:
    """One row per attempt the sweep ended for a stall."""
    line = "shard {shard} attempt {attempt}: ended after {after_s} s {still}"
    return [("stalled", line.format(**st, still=_STILL[st.get("cause")])) for st in s.get("stalled") or []]


def _ran_rows(s: dict[str, Any]) -> list[tuple[str, Any]]:
    """The summary rows of a run that ran (was not rejected)."""
    fails = ", ".join(f"{k} {v}" for k, v in sorted(s.get("failed_by_reason", {}).items()))
    rows: list[tuple[str, Any]] = [
        ("processed", s["processed"]),
        ("failed", f"{s['failed']}" + (f"  ({fails})" if fails else "")),
    ]
    if s.get("reason"):
        rows.append(("reason", s["reason"]))
    output = s.get("output_dir")
    if output and s.get("outcome") != "succeeded":
        output = f"{output}  (the run {s.get('outcome')}: output/ holds only the shards that committed)"
    rows += [
        ("models", ", ".join(s.get("models") or []) or "-"),
        ("shards", s["shards"]),
        ("retry passes", s["retry_passes"]),
        ("split", _splits(s)),
        *_stalled_rows(s),
        ("wall time", f"{s['wall_s']} s"),
        _rate_row(s),
        ("output (S3)", s.get("output_prefix")),
        ("output (local)", output),
        ("failures", f"{s.get('failures_dir')}  (one JSON line per failed key)" if s.get("failed") else None),
        ("worker logs", s.get("logs")),
    ]
    rows = [(k, v) for k, v in rows if v is not None]
    rows += [("damaged", f"{d['key']}  (kept the parts that decode: {d['note']})") for d in s.get("damaged") or []]
    if s.get("index"):
        query = {"text": "--text 'WORDS'", "audio": "--audio FILE"}.get(s.get("kind") or "image", "--image FILE")
        rows.append(("index", f"{s['index']}  ({s.get('index_rows')} rows; sluice search {s['index']} {query})"))
    elif s.get("index_error"):
        rows.append(("index", f"none: {s['index_error']}"))
    if s.get("input_prefix"):
        rows.append(("input (S3)", s["input_prefix"]))
    if s.get("input_dir"):
        rows.append(("input (local)", s["input_dir"]))
    if s.get("metrics"):
        rows.append(("metrics", s["metrics"]))
    if s.get("lineage"):
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(s.get("skipped", {}).items())) or "none"
        rows.append(("since", f"{', '.join(s['lineage'])} (incremental: skipped {skipped})"))
    if s.get("prepare"):
        p = s["prepare"]
        rows.append(
            (
                "prepare",
                f"{p['workers']} workers, {p['keys_in']} keys in, {p['unique_keys']} unique "
                f"({p['duplicates']} duplicates), {p['shards']} shards, {p['seconds']} s, "
                f"peak {p['peak_rss_mb_per_worker']} MB a worker",
            )
        )
    return rows
