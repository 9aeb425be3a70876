"""Data locality: input buckets outside the stack's Region, warned about and priced into the estimate.

Each bucket's Region comes from GetBucketLocation, cached per bucket for the process (a warm
Lambda asks once). Transfer is priced per GB (sluice.preflight.estimate.transfer_per_gb) on the
input's size when known, else on AVG_OBJECT_BYTES an object, and said so.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from sluice.preflight.checks import Check, Preflight
from sluice.preflight.estimate import transfer_per_gb

AVG_OBJECT_BYTES = 250_000  # an assumed web-sized JPEG, when the input's size is not known
_REGIONS: dict[str, str | None] = {}  # bucket -> Region (None: GetBucketLocation was refused)
# GetBucketLocation's legacy answers: no constraint is us-east-1, "EU" is eu-west-1.
_LEGACY = {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}


def bucket_region(s3: Any, bucket: str) -> str | None:
    """The bucket's Region (cached), or None when S3 does not say (no permission, no bucket)."""
    if bucket not in _REGIONS:
        try:
            loc = s3.get_bucket_location(Bucket=bucket).get("LocationConstraint")
        except (ClientError, BotoCoreError):
            _REGIONS[bucket] = None
        else:
            _REGIONS[bucket] = _LEGACY.get(loc, loc)
    return _REGIONS[bucket]


@dataclass(frozen=True)
class InputSize:
    """What is known of the input's size: its keys, and its bytes when known."""

    keys: int
    n_bytes: int | None = None

    @property
    def gb(self) -> float:
        return (self.n_bytes if self.n_bytes is not None else self.keys * AVG_OBJECT_BYTES) / 1e9

    @property
    def basis(self) -> str:
        if self.n_bytes is not None:
            return "the input's size"
        return f"assumed {AVG_OBJECT_BYTES // 1000} KB an object (sluice plan --input-gb N for the real size)"


def add_locality(pf: Preflight, buckets: Iterable[str], stack_region: str | None, s3: Any, size: InputSize) -> None:
    """One warning per input bucket outside `stack_region`, and the transfer priced into pf.cost."""
    names = sorted(set(buckets))
    if not names or not stack_region:
        return
    away = {b: r for b in names if (r := bucket_region(s3, b)) is not None and r != stack_region}
    if not away:
        return
    share = size.gb / len(names)  # keys are not counted per bucket: assumed spread evenly
    per_gb = transfer_per_gb()
    for bucket, region in away.items():
        usd = share * per_gb
        advice = (
            f"input bucket {bucket} is in {region}, the stack in {stack_region}: about {share:,.1f} GB cross Regions "
            f"at ${per_gb:g}/GB = ${usd:,.2f} ({size.basis}), and every GET pays the distance: "
            f"deploy the stack in {region} or copy the input to {stack_region}"
        )
        pf.checks.append(Check("data locality", round(share, 1), 0, "warn", advice, f"GB from {region}"))
    gb = share * len(away)
    usd = round(gb * per_gb, 2)
    pf.cost["transfer_gb"] = round(gb, 1)
    pf.cost["transfer_usd"] = usd
    for k in ("on_demand_usd", "spot_usd"):  # the estimate includes the transfer
        if pf.cost.get(k) is not None:
            pf.cost[k] = round(pf.cost[k] + usd, 2)


def input_buckets(inp: Any, default_bucket: str | None) -> list[str]:
    """The image buckets a manifest's input names (InputSpec): a prefix's, inline keys', else bare keys' bucket."""
    if inp.prefix:
        return [inp.prefix[5:].split("/", 1)[0]]
    bare = inp.bucket or default_bucket
    if inp.keys is not None:
        named = {k[5:].split("/", 1)[0] for k in inp.keys if k.startswith("s3://")}
        return sorted(named | ({bare} if bare and any(not k.startswith("s3://") for k in inp.keys) else set()))
    return [bare] if bare else []  # a key list's or inventory's own keys are not read here
