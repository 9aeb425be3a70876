"""`sluice plan`'s preflight table, for a scanned input or an assumed number of keys."""

from __future__ import annotations

from typing import Any, TextIO

from sluice.contracts.manifest import Manifest
from sluice.control.indexing import plan as index_plan
from sluice.control.sweep.stragglers import plan_lines
from sluice.plan.layout import Layout, layout
from sluice.preflight.checks import CHILD_STARTUP_S, Preflight
from sluice.preflight.facts import Capacity, RunFacts, asked_gpus
from sluice.settings import Settings

MARK = {"ok": "ok", "warn": "WARN", "error": "ERROR"}


def facts_for(
    manifest: Manifest,
    unique_keys: int,
    settings: Settings,
    timeout_s: int,
    cap: Capacity | None = None,
    lay: Layout | None = None,
) -> RunFacts:
    """The run the manifest makes of `unique_keys` keys (`lay`, else its layout at `cap` or the stack's)."""
    cap = cap or Capacity.build(settings)
    lay = lay or layout(unique_keys, manifest, settings.max_array_size, cap)
    return RunFacts(
        unique_keys=unique_keys,
        keys_per_shard=lay.keys_per_shard,
        n_shards=lay.n_shards,
        mode=manifest.job.mode,
        jobs=[(j.kind, j.shard_count) for j in lay.jobs],
        gpus_per_worker=max(1, cap.worker_gpus),
        gpus_asked=asked_gpus(manifest),
        timeout_s=timeout_s,
        in_lambda=unique_keys <= settings.prepare_over_keys,
        max_keys=settings.max_keys,
        models=len(manifest.models),
    )


def _num(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() or abs(v) >= 100 else f"{v:,.2f}"


def hours_line(c: dict[str, Any]) -> str:
    """'GPU-hours 119.05 working + 500.00 starting (30,000 workers x 60 s) = 619.05'."""
    if not c.get("startup_gpu_hours"):
        return f"{c['gpu_hours']:,.2f} GPU-hours"
    return (
        f"GPU-hours {c['working_gpu_hours']:,.2f} working + {c['startup_gpu_hours']:,.2f} starting "
        f"({c['workers']:,} workers, {CHILD_STARTUP_S} s each, assumed) = {c['gpu_hours']:,.2f}"
    )


def render(pf: Preflight, out: TextIO) -> None:
    """The checks as a table, then the cost estimate."""
    render_summary(pf.as_dict(), out)


def render_summary(summary: dict[str, Any], out: TextIO) -> None:
    """`checks` and `cost` (Preflight.as_dict, or `sluice plan --json`) as a table."""
    checks = summary["checks"]
    rows = [(c["name"], _num(c["value"]), _num(c["limit"]), c["unit"], MARK[c["status"]], c["advice"]) for c in checks]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    out.write("\npreflight (value of limit)\n")
    for name, value, limit, unit, status, advice in rows:
        out.write(f"  {status:<5}  {name:<{widths[0]}}  {value:>{widths[1]}} of {limit:>{widths[2]}}  {unit}\n")
        if advice:
            out.write(f"         {advice}\n")
    c = summary["cost"]
    price = (
        f"about ${c['on_demand_usd']:,.2f} On-Demand, ${c['spot_usd']:,.2f} Spot on {c['family']}"
        if c.get("on_demand_usd") is not None
        else f"no price for {c['family']} (SLUICE_PRICES_FILE)"
    )
    out.write(f"\ncost            {hours_line(c)}, {price}\n")
    out.write(f"                prices: {c['prices']}\n")
    if c.get("transfer_usd") is not None:  # input in another Region: sluice.preflight.locality
        out.write(f"                includes ${c['transfer_usd']:,.2f} for {c['transfer_gb']:,.1f} GB across Regions\n")
    if "tail" in summary:  # `sluice plan`: the tail's split policy (sluice.control.sweep.stragglers)
        out.write("\n" + "".join(line + "\n" for line in plan_lines(summary["tail"])))
    if summary.get("index"):  # `sluice plan`: the index stage after the run (sluice.control.indexing.plan)
        out.write("\n" + "".join(line + "\n" for line in index_plan.lines(summary["index"])))
    elif "index" in summary:
        out.write("\nindex           off (output.index)\n")
