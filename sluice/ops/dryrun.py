"""`sluice plan` and `sluice submit`'s check: the manifest Lambda's validation, run on this machine.

The same parser, checks (sluice.input.checks) and key scan as the Lambda, so what `plan` rejects
the Lambda rejects too, and `submit` refuses to upload it. A local file is named by its path
in the reasons (the Lambda names its s3:// URI); a local key list is read from disk.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

from sluice.aws.s3uri import parse_s3_uri
from sluice.contracts.manifest import Manifest
from sluice.control.indexing import plan as index_plan
from sluice.control.sweep.stragglers import plan_view
from sluice.errors import Rejection
from sluice.input.checks import check_manifest, guarded, reading_input
from sluice.input.keys import iter_keys
from sluice.input.manifest import ManifestSource, parse_manifest, read_manifest_object
from sluice.input.sources import KEYLIST_SUFFIXES, KeyBatch, Problems, iter_keylist
from sluice.ops.plan_report import facts_for
from sluice.plan.layout import keylist_manifest, layout, run_times
from sluice.plan.scan import scan
from sluice.preflight import Capacity, preflight
from sluice.preflight.checks import Check, Preflight
from sluice.preflight.locality import InputSize, add_locality
from sluice.settings import Settings

LISTING_ADVICE_KEYS = 10_000_000  # above this a prefix input should be an S3 Inventory report (docs/manifest.md)


def _file_chunks(path: str, chunk: int = 8 * 2**20) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while data := fh.read(chunk):
            yield data


def _local(
    path: str, name: str, settings: Settings, problems: Problems, s3: Callable[[], Any]
) -> tuple[Manifest, Iterator[KeyBatch] | None]:
    if not os.path.isfile(path):  # a plain rejection naming the path, not an unexpected error's traceback
        what = "a folder, not a file" if os.path.isdir(path) else "no such file"
        raise Rejection(f"{path}: {what} (give a .json manifest or a .txt/.csv/.jsonl key list, or an s3:// URI)")
    lower = name.lower()
    if lower.endswith(KEYLIST_SUFFIXES):
        kind = next(s for s in KEYLIST_SUFFIXES if lower.endswith(s))
        keys = iter_keylist(_file_chunks(path), path, kind, settings.default_input_bucket, problems)
        return keylist_manifest(settings), keys
    size = os.path.getsize(path)
    if size > settings.max_manifest_bytes:  # before reading it, as the Lambda does
        raise Rejection(
            f"{path}: manifest is {size} bytes, over the {settings.max_manifest_bytes}-byte limit "
            "(SLUICE_MAX_MANIFEST_BYTES): put the keys in a key-list object and name it in input.key_list"
        )
    with open(path, "rb") as fh:
        body = fh.read()
    src = ManifestSource("local", name, body, path=path)
    manifest = parse_manifest(src, settings)
    if manifest.input.inventory == src.uri:  # an S3 Inventory manifest.json, here on disk
        return manifest, _local_report(path, body, settings, problems, s3)
    return manifest, None


def _local_report(
    path: str, raw: bytes, settings: Settings, problems: Problems, s3: Callable[[], Any]
) -> Iterator[KeyBatch]:
    """A local copy of an S3 Inventory manifest.json: checked here (and its .checksum, when beside it);
    its data files are read from its destination bucket."""
    import hashlib

    from sluice.input.inventory import checksum_uri, iter_report, read_inventory_manifest

    report = read_inventory_manifest(raw, path)
    ck = checksum_uri(path)
    if os.path.exists(ck):
        with open(ck, "rb") as fh:
            want = fh.read(1024).decode("ascii", "replace").strip().lower()
        if want != hashlib.md5(raw, usedforsecurity=False).hexdigest():
            raise Rejection(f"{path}: its MD5 does not match {ck}: the manifest is damaged or was changed")
    return iter_report(s3(), report, settings, problems)


@dataclass(frozen=True)
class DryRun:
    """What to dry-run, and how."""

    source: str  # a local path or an s3:// URI
    settings: Settings
    name: str | None = None  # the object name it will have under manifests/ (its type follows it)
    control: str | None = None  # the control bucket, when known
    bucket_hint: str | None = None  # how a bare key gets its bucket here (the CLI names its flag)
    assume_keys: int | None = None  # plan that many unique keys instead of reading the input
    decode: str | None = None  # job.decode instead of the manifest's
    decode_per_core_s: float | None = None  # a measured CPU decode rate instead of the assumption
    input_bytes: int | None = None  # the input's size, for the cross-Region transfer estimate


def dry_run(req: DryRun, s3: Callable[[], Any]) -> dict[str, Any]:
    """Validate and scan the source as the Lambda would; the plan it would make.

    Raises Rejection with every reason; the preflight's checks (errors included) are in the
    result's "checks".
    """
    source, settings, control, assume_keys = req.source, req.settings, req.control, req.assume_keys
    name = req.name
    problems = Problems(req.bucket_hint) if req.bucket_hint else Problems()
    keys: Iterator[KeyBatch] | None = None
    with reading_input():
        if source.startswith("s3://"):
            bucket, key = parse_s3_uri(source)
            manifest = parse_manifest(read_manifest_object(s3(), bucket, key, settings), settings)
            client = s3()
        else:
            manifest, keys = _local(source, name or os.path.basename(source), settings, problems, s3)
            client = None if keys is not None else s3()
        check_manifest(manifest, settings, control=control, s3=client)
        if req.decode:
            manifest = manifest.model_copy(update={"job": manifest.job.model_copy(update={"decode": req.decode})})
        since = _incremental(manifest, control, s3) if manifest.input.since_run else None
    if assume_keys is not None:
        assumed = _summary(req, manifest, {"keys_seen": assume_keys, "unique_keys": assume_keys})
        return assumed | ({"incremental": since} if since else {})

    def checked(batches: Iterator[KeyBatch]) -> Iterator[KeyBatch]:
        yield from batches
        problems.raise_if_any()

    batches = checked(keys) if keys is not None else iter_keys(manifest, client, settings, problems)
    with scan(guarded(batches), max_keys=settings.max_keys) as sc:
        scanned = {
            "keys_seen": sc.total_keys,
            "unique_keys": sc.unique_keys,
            "duplicates_removed": sc.duplicates,
            "buckets": sorted(sc.buckets),
        }
    summary = _summary(req, manifest, scanned) | ({"incremental": since} if since else {})
    if client is not None and manifest.input.keys is None:  # the keys were read from S3: so can their Regions be
        _locality(summary, client, InputSize(sc.unique_keys, req.input_bytes))
    return summary


def _locality(summary: dict[str, Any], s3: Any, size: InputSize) -> None:
    """Input buckets outside the stack's Region (the client's): a warning each, the transfer in the cost."""
    pf = Preflight(checks=[], cost=summary["cost"])
    add_locality(pf, summary["buckets"], s3.meta.region_name, s3, size)
    summary["checks"] = summary["checks"] + [asdict(c) for c in pf.checks]


def _incremental(manifest: Manifest, control: str | None, s3: Callable[[], Any]) -> dict[str, Any]:
    """An incremental manifest's lineage, read from the control bucket's plans (the runs table is not read).

    Which keys it skips is decided by the prepare stage, which reads the lineage's output; the
    plan's keys and shards here are the input's before that.
    """
    from sluice.control.intake.lineage import resolve

    out: dict[str, Any] = {"since_run": manifest.input.since_run, "lineage": None, "skipped": None}
    if control is None:
        out["note"] = "lineage not checked: set SLUICE_CONTROL_BUCKET (or plan an s3:// manifest in it)"
        return out
    lineage = resolve(manifest, "sluice-plan", control, s3(), None)
    out["lineage"] = lineage.ids
    out["note"] = (
        "the prepare stage decides which keys are unchanged (it reads the lineage's output): keys and shards "
        "here are before that; the runs' status is checked when the manifest is uploaded"
    )
    return out


def _reducers_note(n: int, manifest: Manifest, settings: Settings) -> str:
    """What the prepare stage's reducers may add: each fills its own last shard (docs/manifest.md)."""
    from sluice.prepare.split import choose_partitions

    reducers = choose_partitions(n, manifest.job.mode, manifest.job.nodes)
    if n <= settings.prepare_over_keys or manifest.job.mode != "array" or reducers < 2:
        return ""
    return f"; the prepare stage's {reducers} reducers may add up to {reducers - 1} partly filled shards"


def _summary(req: DryRun, manifest: Manifest, scanned: dict[str, Any]) -> dict[str, Any]:
    """The layout of the scanned (or assumed) keys, and the preflight of that run."""
    source, settings = req.source, req.settings
    n = scanned["unique_keys"]
    cap = Capacity.build(settings).for_manifest(manifest)  # as the manifest function builds it (Context)
    if req.decode_per_core_s:
        cap = replace(cap, decode_per_core_s=req.decode_per_core_s)
    # The prepare stage sizes shards from the keys it reads, duplicates included (docs/manifest.md).
    staged = scanned["keys_seen"] > settings.prepare_over_keys
    lay = layout(scanned["keys_seen"] if staged else n, manifest, settings.max_array_size, cap)
    timeout, stall_after_s = run_times(manifest, lay.keys_per_shard, cap)
    pf = preflight(facts_for(manifest, n, settings, timeout, cap, lay), cap)
    index = index_plan.estimate(manifest, n, settings)  # the index stage: its mode, stage jobs, time and cost
    if index is not None:
        pf.cost["index_usd"] = index["usd"]
    if manifest.input.prefix and n > LISTING_ADVICE_KEYS:
        pf.checks.append(
            Check(
                "prefix listing",
                math.ceil(n / 1000),
                LISTING_ADVICE_KEYS // 1000,
                "warn",
                "a prefix is listed 1,000 keys a request, one request after another within each listed range: "
                "above about 10M objects use an S3 Inventory report (input.inventory; docs/manifest.md)",
                "ListObjectsV2 requests",
            )
        )
    return {
        "manifest": source,
        "assumed": "buckets" not in scanned,
        "duplicates_removed": 0,
        "buckets": [],
        **scanned,
        "mode": manifest.job.mode,
        "shards": lay.n_shards,
        "keys_per_shard": lay.keys_per_shard,
        "keys_per_shard_why": lay.why + _reducers_note(n, manifest, settings),
        "spot_allowed": manifest.job.mode == "array",
        "jobs": [j.model_dump() for j in lay.jobs],
        "models": [m.model_dump() | {"name": m.output_name} for m in manifest.models],
        "timeout_s": timeout,
        "timeout_derived": manifest.job.timeout_s is None,
        "stall_after_s": stall_after_s,
        "images_per_gpu_s": cap.rate,
        "images_per_gpu_s_source": cap.rate_source,
        "decode": manifest.job.decode,
        "decode_binds": cap.decode_binds,
        "instance_type": cap.instance_type,
        "index": index,
        **pf.as_dict(),
        "tail": plan_view(settings, manifest.job.mode, pf.cost),  # the tail's split policy and its worst case
    }
