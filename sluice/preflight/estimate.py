"""Planning figures: images per GPU-second by GPU family, and GPU-hour prices. Rough by nature.

Both tables are starting points, not measurements of your model: measure with
`python -m gpu_worker.autotune --model URI` on the instance type and pass its images/s
(`sluice plan --images-per-gpu-s N`, or SLUICE_IMAGES_PER_GPU_S); override prices with a
JSON file (SLUICE_PRICES_FILE: {"g5": {"on_demand": 1.006, "spot": 0.40, "gpus": 1}, ...,
"_transfer_per_gb": 0.02}).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

# End-to-end images per second per GPU (fetch, decode and a ViT-B/16-class encoder at 224 px,
# half precision) for each family's GPU: order-of-magnitude figures for planning, not a benchmark.
IMAGES_PER_GPU_S: dict[str, float] = {
    "g4dn": 150.0,  # NVIDIA T4
    "g5": 350.0,  # A10G
    "g6": 300.0,  # L4
    "g6e": 700.0,  # L40S
    "p4d": 900.0,  # A100 40 GB
    "p5": 1_500.0,  # H100
}
DEFAULT_FAMILY = "g6e"  # the first of template.yaml's GpuInstanceTypes default

PRICES_DATE = "2025-06"
PRICES_SOURCE = "aws.amazon.com/ec2/pricing/on-demand, us-east-1 Linux, smallest size of each family"
SPOT_FRACTION = 0.4  # Spot is typically 60% below On-Demand for these families; it varies by hour and AZ


@dataclass(frozen=True)
class Price:
    """USD per instance-hour, and GPUs per instance."""

    on_demand: float
    gpus: int = 1
    spot: float | None = None

    def per_gpu_hour(self, spot: bool) -> float:
        hourly = (self.spot if self.spot is not None else self.on_demand * SPOT_FRACTION) if spot else self.on_demand
        return hourly / self.gpus


PRICES: dict[str, Price] = {
    "g4dn": Price(0.526),  # g4dn.xlarge
    "g5": Price(1.006),  # g5.xlarge
    "g6": Price(0.8048),  # g6.xlarge
    "g6e": Price(1.861),  # g6e.xlarge
    "p4d": Price(32.7726, gpus=8),  # p4d.24xlarge
    "p5": Price(55.04, gpus=8),  # p5.48xlarge (after the 2025 price cut)
}


def prices() -> dict[str, Price]:
    """The table, with SLUICE_PRICES_FILE's entries on top."""
    path = os.environ.get("SLUICE_PRICES_FILE")
    if not path:
        return dict(PRICES)
    raw = json.loads(Path(path).read_text())
    return {**PRICES, **{k: Price(**v) for k, v in raw.items() if not k.startswith("_")}}


# Data transfer between Regions, per GB, charged by the source Region (most US and EU Regions:
# $0.02/GB; some Asia Pacific and South America ones charge more). Override with "_transfer_per_gb"
# in SLUICE_PRICES_FILE.
TRANSFER_PER_GB = 0.02
TRANSFER_SOURCE = "aws.amazon.com/ec2/pricing/on-demand (data transfer between Regions), 2025-06"


def transfer_per_gb() -> float:
    """USD a GB read across Regions: the table's, or SLUICE_PRICES_FILE's "_transfer_per_gb"."""
    path = os.environ.get("SLUICE_PRICES_FILE")
    if path:
        raw = json.loads(Path(path).read_text())
        if "_transfer_per_gb" in raw:
            return float(raw["_transfer_per_gb"])
    return TRANSFER_PER_GB


def family_of(instance_type: str) -> str:
    """g5.2xlarge -> g5; a family name is itself."""
    return instance_type.split(".", 1)[0].strip().lower()


@dataclass(frozen=True)
class Cost:
    """GPU-hours (working plus starting) and their price, On-Demand and Spot."""

    family: str
    gpu_hours: float  # the total: working_gpu_hours + startup_gpu_hours
    on_demand_usd: float | None
    spot_usd: float | None
    working_gpu_hours: float = 0.0  # the keys at the planned images/s
    startup_gpu_hours: float = 0.0  # each worker's start-up (sluice.preflight.checks.CHILD_STARTUP_S)
    workers: int = 0  # array children or MNP nodes that start

    def as_dict(self) -> dict[str, object]:
        return {
            "family": self.family,
            "gpu_hours": round(self.gpu_hours, 2),
            "working_gpu_hours": round(self.working_gpu_hours, 2),
            "startup_gpu_hours": round(self.startup_gpu_hours, 2),
            "workers": self.workers,
            "on_demand_usd": None if self.on_demand_usd is None else round(self.on_demand_usd, 2),
            "spot_usd": None if self.spot_usd is None else round(self.spot_usd, 2),
            "prices": f"{PRICES_SOURCE}, {PRICES_DATE} (SLUICE_PRICES_FILE overrides)",
        }


def cost(family: str, working: float, starting: float = 0.0, workers: int = 0) -> Cost:
    """What `working` plus `starting` GPU-hours on this family cost (None where the family has no price)."""
    hours, p = working + starting, prices().get(family)
    on_demand, spot = (None, None) if p is None else (hours * p.per_gpu_hour(False), hours * p.per_gpu_hour(True))
    return Cost(family, hours, on_demand, spot, working, starting, workers)
