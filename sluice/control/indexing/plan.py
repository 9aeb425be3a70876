"""The index stage as `sluice plan` shows it: which mode a run gets, its stage jobs, their time and cost.

One function (`estimate`) for `sluice plan`'s text, its --json and the preflight's cost, from the
same decision the claim makes (sluice.control.policy.index_mode) and the per-row rates and
Fargate prices kept in sluice.control.policy (their sources there). Figures are estimates: the
rates were measured on 2 shared cores; the children are assumed to run at once (the prepare
compute environment's MaxvCpus permitting: PrepareMaxVcpus).
"""

from __future__ import annotations

from typing import Any

from sluice.contracts.manifest import Manifest
from sluice.control.policy import (
    FARGATE_PRICE_SOURCE,
    INDEX_RESOURCES,
    fargate_usd,
    index_mode,
    index_rows,
    index_stage_s,
    index_stage_timeout_s,
    index_timeout_s,
)
from sluice.settings import Settings


def estimate(manifest: Manifest, keys: int, settings: Settings) -> dict[str, Any] | None:
    """The index stage of a run of `keys` keys: mode, stages (jobs, seconds, timeout, USD), wall time, cost.

    None when the manifest turns the index off.
    """
    if not manifest.output.index.enabled:
        return None
    c = manifest.input.content
    rows = index_rows(c, len(manifest.models), keys)
    mode, children = index_mode(rows, settings.index_fleet_rows, settings.index_rows_per_child)
    fixed = settings.index_timeout_s  # SLUICE_INDEX_TIMEOUT_S: every job's, as the claim fixes it
    if mode == "single":
        s = index_stage_s("single", rows, 1)
        stages = [_stage("single", 1, s, fixed or index_timeout_s(rows))]
    else:
        stages = [
            _stage(st, children if st == "segments" else 1, index_stage_s(st, rows, children),
                   fixed or index_stage_timeout_s(st, rows, children))
            for st in ("train", "segments", "commit")
        ]  # fmt: skip
    return {
        "mode": mode,
        "rows": rows,
        "children": children if mode == "fleet" else 0,
        "fleet_rows": settings.index_fleet_rows,
        "rows_per_child": settings.index_rows_per_child,
        "stages": stages,
        "wall_s": round(sum(st["seconds"] for st in stages)),  # the stages run one after another
        "usd": round(sum(st["usd"] for st in stages), 2),
        "prices": f"Fargate {FARGATE_PRICE_SOURCE}",
    }


def _stage(stage: str, jobs: int, seconds: float, timeout_s: int) -> dict[str, Any]:
    vcpus, mib = INDEX_RESOURCES[stage]
    return {
        "stage": stage,
        "jobs": jobs,
        "vcpus": vcpus,
        "memory_mib": mib,
        "seconds": round(seconds),  # each job's (the children run at once)
        "timeout_s": timeout_s,
        "usd": round(jobs * fargate_usd(stage, seconds), 2),
    }


def lines(ix: dict[str, Any]) -> list[str]:
    """`sluice plan`'s text for the index stage (estimate's dict)."""
    if ix["mode"] == "single":
        why = f"{ix['rows']:,} rows < SLUICE_INDEX_FLEET_ROWS {ix['fleet_rows']:,}: one job"
    else:
        why = (
            f"{ix['rows']:,} rows >= SLUICE_INDEX_FLEET_ROWS {ix['fleet_rows']:,}: train, {ix['children']:,} segment "
            f"children (SLUICE_INDEX_ROWS_PER_CHILD {ix['rows_per_child']:,}), commit"
        )
    out = [f"index mode      {ix['mode']}  ({why})"]
    for st in ix["stages"]:
        jobs = f"{st['jobs']:,} x " if st["jobs"] > 1 else ""
        out.append(
            f"  {st['stage']:<13} {jobs}{st['vcpus']} vCPU / {st['memory_mib']:,} MiB, about {_hms(st['seconds'])}"
            f" each (timeout {st['timeout_s']:,} s), ${st['usd']:,.2f}"
        )
    out.append(f"index time      about {_hms(ix['wall_s'])}, ${ix['usd']:,.2f} ({ix['prices']})")
    return out


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
