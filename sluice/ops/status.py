"""`sluice status` and `sluice runs`: read the run ledger (real AWS or AWS_ENDPOINT_URL)."""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime
from typing import Any, TextIO

from sluice.contracts.sections import KIND_WORDS, TIMED_KINDS
from sluice.contracts.status import RunStatus
from sluice.control.sweep.stall import beat_items, stalled_attempts
from sluice.control.sweep.stragglers import slowest, views
from sluice.control.sweep.tail import split_items
from sluice.control.sweep.waiting import waiting_causes
from sluice.control.table.ledger import Ledger
from sluice.control.table.records import ShardRecords

SHOWN = (
    "run_id",
    "status",
    "manifest_uri",
    "mode",
    "total_keys",
    "duplicates",
    "output_prefix",
    "reason",
    "reasons",
    "lineage",
    "skipped",
    "warnings",
    "gpu_family",
    "kind",
)

_STILL = {"no_beat": "no first progress beat", "no_progress": "no progress"}  # StalledAttempt.cause


def run_status(ledger: Ledger, run_id: str, beats_table: str | None = None) -> dict[str, Any] | None:
    """The run's row plus derived progress, as plain JSON values (and, given the beats table, its tail)."""
    row = ledger.get(run_id)
    if row is None:
        return None
    plain = row.model_dump(mode="json", include=set(SHOWN), exclude_none=True)
    if row.job_ids:
        plain["job_ids"] = row.job_ids
    if row.prepare is not None:
        plain["prepare"] = row.prepare.model_dump(mode="json")
    if row.index is not None:  # the index stage (sluice.control.indexing.stage): uri, state, rows, ...
        plain["index"] = row.index.model_dump(mode="json", exclude_defaults=True, exclude={"lease_until"})
    counts = ShardRecords(ledger.client, ledger.table).counts(run_id)
    plain.update(
        shards_total=row.total_shards,
        shards_done=counts.shards_done,
        shards_failed=counts.shards_failed,
        keys_processed=counts.keys_processed,
        keys_failed=counts.keys_failed,
        parts=counts.parts_embedded,
        media_s=counts.media_ms / 1000,
        gpu_hours=round(counts.gpu_seconds / 3600, 3),
        created_at=_iso(row.created_at),
        finished_at=_iso(row.finished_at),
    )
    stalled = stalled_attempts(ledger.client, ledger.table, run_id)
    waiting = waiting_causes(ledger.client, ledger.table, run_id)
    plain["stalled"] = [s.model_dump(mode="json", exclude_none=True) for s in stalled]
    plain["waiting"] = [w.model_dump(mode="json") for w in waiting]
    plain["splits"] = [
        {k: (float(v) if k.endswith("_s") else v) for k, v in i.items() if k not in ("pk", "sk")}
        for i in split_items(ledger.client, ledger.table, run_id)
    ]
    if beats_table and row.status.active:
        plain["slowest"] = slowest(views(beat_items(ledger.client, beats_table, run_id)), time.time())
    return plain


def _iso(ts: Any) -> str | None:
    return datetime.fromtimestamp(int(ts), UTC).isoformat(timespec="seconds") if ts else None


def _bar(done: int, total: int, width: int = 30) -> str:
    frac = done / total if total else 0.0
    filled = round(frac * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def render(s: dict[str, Any], out: TextIO) -> None:
    out.write(f"run       {s['run_id']}  {s['status']}\n")
    out.write(f"manifest  {s.get('manifest_uri', '-')}\n")
    if s.get("reasons"):
        for r in s["reasons"]:
            out.write(f"reason    {r}\n")
    if s.get("reason"):
        out.write(f"reason    {s['reason']}\n")
    for w in s.get("warnings", []):  # Run Submitted's: a builtin stand-in model, the preflight's
        out.write(f"warning   {w}\n")
    if s.get("prepare"):
        p = s["prepare"]
        out.write(
            f"prepare   {p['workers']} workers, {p['partitions']} partitions, about {p['input_keys_estimate']:,} keys "
            f"(jobs {p['map_job_id']}, {p['reduce_job_id']})\n"
        )
    if s.get("lineage"):
        skipped = ", ".join(f"{n:,} {why}" for why, n in sorted(s.get("skipped", {}).items())) or "none"
        out.write(f"since     {', '.join(s['lineage'])} (incremental: skipped {skipped})\n")
    if s.get("total_keys") is not None:
        out.write(f"shards    {_bar(s['shards_done'], s['shards_total'])}  ({s['shards_failed']} failed)\n")
        keys_done = s["keys_processed"] + s["keys_failed"]
        kind = s.get("kind")
        noun, part = KIND_WORDS[kind] if kind else ("keys", None)
        rows = f"; {s.get('parts', 0):,} {part}" if part else ""  # from the settled shards' results
        if kind in TIMED_KINDS:
            rows += f", {s.get('media_s', 0.0):,.1f} s of audio"
        out.write(f"{noun:<9} {_bar(keys_done, s['total_keys'])}  ({s['keys_failed']} failed{rows})\n")
    for st in s.get("stalled", []):
        redo = f", resumed by job {st['redo_job_id']}" if st.get("redo_job_id") else ", no attempt left"
        out.write(
            f"stalled   shard {st['shard']} attempt {st['attempt']}: {_STILL[st.get('cause', 'no_progress')]} "
            f"for {st['after_s']:.0f} s{redo}\n"
        )
    for r in s.get("slowest", []):
        than = f" ({r['vs_median']}x the median {r['median_s']} s)" if r.get("vs_median") else ""
        out.write(
            f"slowest   shard {r['shard']} rank {r['rank']}: {r['processed']:,}/{r['todo']:,} keys at "
            f"{r['keys_per_s']}/s, expected to end in {r['ends_in_s']:.0f} s{than}\n"
        )
    for sp in s.get("splits", []):
        job = f", job {sp['job_id']}" if sp.get("job_id") else ""
        out.write(
            f"split     shard {sp['shard']} at {sp['at']}: {sp['keys']:,} keys to shard {sp['to_shard']}"
            f" (expected {sp['expected_s']:.0f} s alone vs a {sp['median_s']:.0f} s median;"
            f" child ~{sp['child_s']:.0f} s{job})\n"
        )
    for w in s.get("waiting", []):
        out.write(f"waiting   {w['jobs']} job(s) RUNNABLE for {w['waiting_s']:.0f} s: {w['reason']}\n")
    if s.get("gpu_hours"):
        from sluice.preflight.spent import describe

        out.write(f"gpu time  {describe(s['gpu_hours'], s.get('gpu_family'))}\n")
    if s.get("output_prefix"):
        out.write(f"output    {s['output_prefix']}\n")
    if s.get("index"):
        out.write(f"index     {_index_line(s['index'])}\n")
        if s["index"].get("state") == "indexed":
            query = {"text": "--text 'WORDS'", "audio": "--audio FILE"}.get(s.get("kind") or "image", "--image FILE")
            out.write(f"search    sluice search {s['index']['uri']} {query}\n")


def _index_line(ix: dict[str, Any]) -> str:
    """The index stage in one line: where, its state, and its rows (or why it failed)."""
    if ix["state"] == "indexed":
        return f"{ix['uri']}  indexed: {ix.get('rows', 0):,} rows, ANN {ix.get('ann', 'none')}"
    if ix["state"] == "failed":
        return f"{ix['uri']}  failed: {ix.get('reason', 'no reason given')}"
    fleet = f" on the fleet: train, {ix.get('children')} segment children, commit" if ix.get("mode") == "fleet" else ""
    job = f" (job {ix['job_id']})" if ix.get("job_id") else ""
    return f"{ix['uri']}  {ix['state']}{fleet}{job}"


def cmd_status(
    ledger: Ledger,
    run_id: str,
    *,
    watch: bool | float,
    as_json: bool,
    out: TextIO = sys.stdout,
    beats_table: str | None = None,
) -> int:
    """Print the run's status; with watch (True: every 2 s; a number: every that many), refresh until final.

    Exit 0 unless it failed. `beats_table`: the tail's slowest ranks are read from it.
    """
    interval = 2.0 if watch is True else float(watch)
    while True:
        s = run_status(ledger, run_id, beats_table)
        if s is None:
            print(f"sluice: no run {run_id!r} in table {ledger.table!r}", file=sys.stderr)
            return 1
        if as_json:
            out.write(json.dumps(s) + "\n")
        else:
            if watch:
                out.write("\033[2J\033[H")  # clear the screen between refreshes
            render(s, out)
        out.flush()
        status = RunStatus(s["status"])
        if not watch or status.final:
            return 1 if status in (RunStatus.FAILED, RunStatus.REJECTED) else 0
        time.sleep(interval)


def cmd_runs(ledger: Ledger, *, limit: int, as_json: bool, out: TextIO = sys.stdout) -> int:
    """List recent runs, newest first."""
    listed = {"run_id", "status", "created_at", "total_keys", "shards", "mode", "manifest_uri"}
    rows = [r.model_dump(mode="json", include=listed) for r in ledger.recent_runs(limit)]
    if as_json:
        out.write(json.dumps(rows) + "\n")
        return 0
    out.write(f"{'RUN ID':<40} {'STATUS':<11} {'CREATED (UTC)':<20} {'KEYS':>10} {'SHARDS':>6}  MANIFEST\n")
    for r in rows:
        out.write(
            f"{r['run_id']:<40} {r.get('status', ''):<11} {(_iso(r.get('created_at')) or '')[:19]:<20} "
            f"{r.get('total_keys', '') or '':>10} {r.get('shards', '') or '':>6}  {r.get('manifest_uri', '')}\n"
        )
    return 0
