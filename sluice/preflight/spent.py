"""What a run measured: GPU-hours from its workers' result.json, and their estimated price."""

from __future__ import annotations

from typing import Any

from sluice.contracts.events import RunCost
from sluice.preflight.estimate import PRICES_DATE, PRICES_SOURCE, cost


def run_cost(estimate: dict[str, Any]) -> RunCost | None:
    """The preflight's cost (Preflight.cost) as the events carry it; None for no GPU time."""
    if not estimate.get("gpu_hours"):
        return None
    return RunCost(
        family=estimate["family"],
        on_demand=estimate["on_demand_usd"],
        spot=estimate["spot_usd"],
        prices=estimate["prices"],
    )


def spent(gpu_seconds: int, family: str) -> dict[str, Any]:
    """{"gpu_hours", "cost_usd"} for the outcome events, priced on `family` (the stack's, Capacity.gpu_family)."""
    hours = round(gpu_seconds / 3600, 3)
    if not hours:
        return {"gpu_hours": 0.0, "cost_usd": None}
    c = cost(family, hours)
    rounded = {k: None if v is None else round(v, 2) for k, v in (("on", c.on_demand_usd), ("spot", c.spot_usd))}
    priced = RunCost(
        family=c.family,
        on_demand=rounded["on"],
        spot=rounded["spot"],
        prices=f"{PRICES_SOURCE}, {PRICES_DATE} (SLUICE_PRICES_FILE overrides)",
    )
    return {"gpu_hours": hours, "cost_usd": priced}


def describe(gpu_hours: float, family: str | None) -> str:
    """'12.50 GPU-hours (about $23.26 On-Demand, $9.30 Spot on g6e)'; no price without a family."""
    c = spent(round(gpu_hours * 3600), family)["cost_usd"] if family else None
    if c is None or c.on_demand is None:
        return f"{gpu_hours:,.2f} GPU-hours"
    spot = f", ${c.spot:,.2f} Spot" if c.spot is not None else ""
    return f"{gpu_hours:,.2f} GPU-hours (about ${c.on_demand:,.2f} On-Demand{spot} on {c.family})"
